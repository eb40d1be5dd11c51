"""The support workflow from the design: classify -> research || fetch_history -> draft

The Python form of examples/support.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'support-reply',
    description='Classify a support ticket, research it, draft a reply, get it approved, send it.',
    input_schema={'type': 'object',
                  'required': ['ticket_id', 'body', 'customer_email'],
                  'additionalProperties': False,
                  'properties': {'ticket_id': {'type': 'string', 'minLength': 1},
                                 'body': {'type': 'string', 'minLength': 1},
                                 'customer_email': {'type': 'string', 'format': 'email'}}},
    budget={'max_cost_usd': 2.0, 'max_duration_s': 86400},
    on_error='fail',
)
classify = workflow.agent(
    'classify',
    model='fast',
    timeout_s=30,
    prompt=('Classify this support ticket as billing, technical, spam or other.\n'
            'Ticket: {{ input.body }}\n'),
    output_schema={'type': 'object',
                   'required': ['category', 'urgency'],
                   'properties': {'category': {'type': 'string',
                                               'enum': ['billing', 'technical', 'spam', 'other']},
                                  'urgency': {'type': 'string', 'enum': ['low', 'high']}}},
    script=[{'when': "input.body.contains('refund') || input.body.contains('invoice')",
             'output': {'category': 'billing', 'urgency': 'high'}},
            {'when': "input.body.contains('WIN A PRIZE')",
             'output': {'category': 'spam', 'urgency': 'low'}},
            {'output': {'category': 'technical', 'urgency': 'low'}}],
)

research = workflow.agent(
    'research',
    model='deep',
    after=[classify],
    when="steps.classify.output.category != 'spam'",
    timeout_s=120,
    prompt='Research a {{ steps.classify.output.category }} ticket: {{ input.body }}\n',
    output_schema={'type': 'object',
                   'required': ['findings'],
                   'properties': {'findings': {'type': 'string'}}},
    script=[{'output': {'findings': 'Known issue; the policy allows a fix or a refund within 30 '
                                    'days.'}}],
)

fetch_history = workflow.tool(
    'fetch_history',
    tool='support.fetch_history',
    after=[classify],
    when="steps.classify.output.category != 'spam'",
    params={'ticket_id': '{{ input.ticket_id }}'},
)

draft = workflow.agent(
    'draft',
    model='deep',
    after=[research, fetch_history],
    timeout_s=60,
    input_schema={'type': 'object',
                  'properties': {'research': {'type': 'object',
                                              'required': ['findings'],
                                              'properties': {'findings': {'type': 'string'}}}}},
    prompt=('Draft a reply. Findings: {{ steps.research.output.findings }}.\n'
            'Previous tickets: {{ steps.fetch_history.output.previous_tickets }}.\n'),
    output_schema={'type': 'object',
                   'required': ['subject', 'reply'],
                   'properties': {'subject': {'type': 'string'}, 'reply': {'type': 'string'}}},
    script=[{'output': {'subject': 'Re: ticket {{ input.ticket_id }}',
                        'reply': 'Thanks for reaching out. {{ steps.research.output.findings }}'}}],
)

approve = workflow.human_gate(
    'approve',
    after=[draft],
    approves='send',
    editable=['subject', 'body'],
    approvers='support_leads',
    timeout_s=14400,
    remind_before_s=1800,
    escalation=[{'approvers': 'support_managers', 'timeout_s': 14400}],
    instructions=('Approve the reply to ticket {{ input.ticket_id }}: {{ steps.draft.output.reply '
                  '}}'),
)

workflow.tool(
    'send',
    tool='email.send',
    side_effect=True,
    after=[approve],
    params={'to': '{{ input.customer_email }}',
            'subject': '{{ steps.draft.output.subject }}',
            'body': '{{ steps.draft.output.reply }}{% if steps.approve.output.note %}\n'
                    '\n'
                    'P.S. {{ steps.approve.output.note }}{% endif %}'},
)
