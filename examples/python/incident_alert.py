"""Event-driven: a monitoring system posts an alert to a webhook trigger (docs/triggers.md), whose

The Python form of examples/incident-alert.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'incident-alert',
    description=('Triage a monitoring alert delivered by a trigger; page on-call for a critical '
                 'one, open a ticket otherwise.'),
    input_schema={'type': 'object',
                  'required': ['alert_id', 'service', 'severity', 'message'],
                  'properties': {'alert_id': {'type': 'string'},
                                 'service': {'type': 'string'},
                                 'severity': {'enum': ['critical', 'warning', 'info']},
                                 'message': {'type': 'string', 'maxLength': 4000}}},
)
triage = workflow.agent(
    'triage',
    model='fast',
    prompt=('Alert {{ input.alert_id }} from {{ input.service }} ({{ input.severity }}):\n'
            '{{ input.message }}\n'
            'Summarize it in one sentence for the person on call and name the first check to '
            'make.\n'),
    output_schema={'type': 'object',
                   'required': ['summary', 'first_check'],
                   'properties': {'summary': {'type': 'string'},
                                  'first_check': {'type': 'string'}}},
    script=[{'output': {'summary': '{{ input.service }}: {{ input.message[:120] }}',
                        'first_check': 'Open the {{ input.service }} dashboard and compare with '
                                       'the last deploy.'}}],
)

route = workflow.router(
    'route',
    after=[triage],
    routes=[{'name': 'critical', 'when': "input.severity == 'critical'", 'then': ['page']}],
    default={'name': 'routine', 'then': ['ticket']},
)

workflow.tool(
    'page',
    tool='core.echo',
    after=[route],
    side_effect=True,
    params={'pager': 'on-call',
            'message': '[{{ input.alert_id }}] {{ steps.triage.output.summary }} First: {{ '
                       'steps.triage.output.first_check }}'},
)

workflow.tool(
    'ticket',
    tool='core.echo',
    after=[route],
    side_effect=True,
    params={'queue': 'operations',
            'title': '{{ input.service }}: {{ input.severity }} alert {{ input.alert_id }}',
            'body': '{{ steps.triage.output.summary }}'},
)
