"""Example definitions and registries shared by the definition tests."""

from __future__ import annotations

SUPPORT_WORKFLOW_YAML = """\
name: support-reply
description: Classify a ticket, research it, draft a reply, get it approved, send it.
input_schema:
  type: object
  required: [ticket_id, body, customer_email]
  properties:
    ticket_id: {type: string}
    body: {type: string}
    customer_email: {type: string}
budget: {max_cost_usd: 2.0, max_duration_s: 600}
on_error: fail
steps:
  - name: classify
    type: agent
    model: fast
    prompt: "Classify this ticket: {{ input.body }}"
    timeout_s: 30
    output_schema:
      type: object
      required: [category, urgency]
      additionalProperties: false
      properties:
        category: {type: string, enum: [billing, technical, spam]}
        urgency: {type: integer, minimum: 1, maximum: 5}
    script:
      - when: "input.body.contains('refund')"
        output: {category: billing, urgency: 2}
      - output: {category: technical, urgency: 3}
  - name: research
    type: agent
    model: deep
    after: [classify]
    when: "steps.classify.output.category != 'spam'"
    prompt: "Research this {{ steps.classify.output.category }} ticket: {{ input.body }}"
    output_schema:
      type: object
      required: [notes]
      properties: {notes: {type: string}}
    retry: {max_attempts: 3, backoff: exponential, base_s: 1, max_s: 30}
  - name: fetch_history
    type: tool
    tool: http.get
    after: [classify]
    params: {url: "https://crm.example/tickets/{{ input.ticket_id }}/history"}
    output_schema:
      type: object
      required: [items]
      properties: {items: {type: array, items: {type: string}}}
  - name: draft
    type: agent
    model: deep
    after: [research, fetch_history]
    input_schema:
      type: object
      properties:
        classify:
          type: object
          required: [category]
          properties: {category: {type: string}}
        research:
          type: object
          required: [notes]
          properties: {notes: {type: string}}
    system: You write short, kind support replies.
    prompt: |
      Ticket: {{ input.body }}
      Research: {{ steps.research.output.notes }}
      History: {{ steps.fetch_history.output['items'] | join(', ') }}
    output_schema:
      type: object
      required: [subject, body]
      properties: {subject: {type: string}, body: {type: string}}
  - name: approve
    type: human_gate
    after: [draft]
    approvers: support_leads
    instructions: "Check the reply '{{ steps.draft.output.subject }}' before it is sent."
    timeout_s: 14400
  - name: send
    type: tool
    tool: email.send
    side_effect: true
    after: [approve]
    params:
      to: "{{ input.customer_email }}"
      subject: "{{ steps.draft.output.subject }}"
      body: "{{ steps.draft.output.body }}"
    compensate:
      tool: email.send
      params:
        to: "{{ input.customer_email }}"
        subject: "Correction"
        body: "Please disregard our previous message."
"""

TOOLS = {
    "http.get": {
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "properties": {"url": {"type": "string"}, "timeout_s": {"type": "number"}},
    },
    "email.send": {
        "type": "object",
        "required": ["to", "subject", "body"],
        "properties": {
            "to": {"type": "string"},
            "subject": {"type": "string"},
            "body": {"type": "string"},
        },
    },
}
MODELS = ("fast", "deep")
WORKFLOWS = {
    "enrich-customer": {
        "type": "object",
        "required": ["email"],
        "properties": {"email": {"type": "string"}},
    }
}

TOOLS["pager.page"] = {
    "type": "object",
    "required": ["message"],
    "properties": {"message": {"type": "string"}},
}

# A router with three routes, a map step and a sub-workflow, fanning back in with join: any.
ROUTING_WORKFLOW_YAML = """\
name: triage
input_schema:
  type: object
  required: [body, tickets]
  properties:
    body: {type: string}
    tickets: {type: array, items: {type: string}}
max_parallel: 4
steps:
  - name: score
    type: agent
    model: fast
    prompt: "Rate the urgency of {{ input.body }} from 0 to 1."
    output_schema:
      type: object
      required: [urgency]
      properties: {urgency: {type: number, minimum: 0, maximum: 1}}
  - name: route
    type: router
    after: [score]
    routes:
      - {name: urgent, when: "steps.score.output.urgency > 0.8", then: [page_oncall]}
      - {name: normal, when: "steps.score.output.urgency > 0.3", then: [summarize_each]}
    default: {name: ignore, then: [archive]}
  - name: page_oncall
    type: tool
    tool: pager.page
    after: [route]
    params: {message: "Urgent: {{ input.body }}"}
  - name: summarize_each
    type: map
    after: [route]
    over: input.tickets
    merge: list
    item:
      type: agent
      model: fast
      prompt: "Summarize ticket {{ index }}: {{ item }}"
      output_schema: {type: string}
      script:
        - when: "index == 0"
          output: first
        - output: other
  - name: archive
    type: sub_workflow
    after: [route]
    workflow: enrich-customer
    input: {email: "{{ input.body }}"}
  - name: report
    type: tool
    tool: http.get
    after: [page_oncall, summarize_each, archive]
    join: any
    params: {url: "https://reports.example/triage"}
"""
