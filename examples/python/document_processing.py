"""Document processing: extract every page of one document in parallel (a map, run as a Celery

The Python form of examples/document-processing.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'document-processing',
    description=('Extract the facts of every page of a document in parallel, merge them, '
                 'summarize and store the record.'),
    input_schema={'type': 'object',
                  'required': ['document_id', 'pages'],
                  'properties': {'document_id': {'type': 'string'},
                                 'pages': {'type': 'array',
                                           'minItems': 1,
                                           'maxItems': 200,
                                           'items': {'type': 'object',
                                                     'required': ['number', 'text'],
                                                     'properties': {'number': {'type': 'integer',
                                                                               'minimum': 1},
                                                                    'text': {'type': 'string'}}}}}},
)
extract = workflow.map(
    'extract',
    over='input.pages',
    merge='list',
    item={'type': 'agent',
          'model': 'fast',
          'timeout_s': 60,
          'retry': {'max_attempts': 3, 'base_s': 1, 'max_s': 10},
          'prompt': 'List the key facts of page {{ item.number }} as short sentences: {{ '
                    'item.text }}',
          'output_schema': {'type': 'object',
                            'required': ['page', 'facts'],
                            'properties': {'page': {'type': 'string'},
                                           'facts': {'type': 'array',
                                                     'items': {'type': 'string'}}}},
          'script': [{'output': {'page': '{{ item.number }}', 'facts': ['{{ item.text[:80] }}']}}]},
)

summarize = workflow.agent(
    'summarize',
    model='fast',
    after=[extract],
    prompt=('Summarize document {{ input.document_id }} from the facts of its pages:\n'
            "{% for page in steps.extract.output %}Page {{ page.page }}: {{ page.facts | join('; "
            "') }}\n"
            '{% endfor %}\n'),
    output_schema={'type': 'object',
                   'required': ['summary'],
                   'properties': {'summary': {'type': 'string'}}},
    script=[{'output': {'summary': 'Document {{ input.document_id }}: {{ input.pages | length }} '
                                   'pages processed.'}}],
)

workflow.tool(
    'store',
    tool='core.echo',
    after=[extract, summarize],
    params={'document_id': '{{ input.document_id }}',
            'summary': '{{ steps.summarize.output.summary }}',
            'facts': "{% for page in steps.extract.output %}{{ page.facts | join('\n"
                     "') }}\n"
                     '{% endfor %}'},
)
