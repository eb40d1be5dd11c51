"""The visual workflow builder (docs/builder.md): an admin page that draws a definition as a DAG
and edits it, and the small endpoint that stores where its steps were drawn.

An entry point like the API and the live pages: it saves nothing itself. The page saves a
definition through the API (`POST /api/v1/workflows/`, i.e. `workflow_save`), and a layout
through `services.layouts.version_layout_save`; both check workflow.save themselves.
"""
