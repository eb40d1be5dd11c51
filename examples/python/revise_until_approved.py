"""A bounded loop: draft -> critique -> revise until the critic approves, at most 3 times.

The Python form of examples/revise-until-approved.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'revise-until-approved',
    description=('Draft, critique and revise a short announcement until the critic approves it, '
                 'at most 3 times.'),
    input_schema={'type': 'object',
                  'required': ['topic'],
                  'properties': {'topic': {'type': 'string', 'minLength': 1, 'maxLength': 500},
                                 'audience': {'type': 'string'}}},
    budget={'max_cost_usd': 2.0, 'max_duration_s': 3600},
)
write = workflow.loop(
    'write',
    max_iterations=3,
    input={'topic': '{{ input.topic }}', 'audience': "{{ input.audience | default('customers') }}"},
    until='steps.critique.output.approved',
)
draft = write.agent(
    'draft',
    model='fast',
    prompt=("{% if iteration.number == 1 %}Write a three-sentence announcement for "
            "{{ iteration.input.audience }} about: {{ iteration.input.topic }}\n"
            "{% else %}Revise this announcement:\n"
            "{{ iteration.previous.draft.output.text }}\n"
            "following the critique: {{ iteration.previous.critique.output.feedback }}{% endif %}\n"),
    output_schema={'type': 'object',
                   'required': ['text'],
                   'properties': {'text': {'type': 'string'}}},
    script=[{'output': {'text': 'Draft {{ iteration.number }}: {{ iteration.input.topic }} is '
                                'here for {{ iteration.input.audience }}.'}}],
)
write.agent(
    'critique',
    model='fast',
    after=[draft],
    prompt=('You review announcements for {{ iteration.input.audience }}. Approve only a clear,\n'
            'friendly text that leads with the benefit. Text:\n'
            '{{ steps.draft.output.text }}\n'),
    output_schema={'type': 'object',
                   'required': ['approved', 'feedback'],
                   'properties': {'approved': {'type': 'boolean'}, 'feedback': {'type': 'string'}}},
    script=[{'when': 'iteration.number >= 2',
             'output': {'approved': True, 'feedback': 'Clear and friendly.'}},
            {'output': {'approved': False, 'feedback': 'Lead with what the reader gains.'}}],
)

workflow.tool(
    'publish',
    tool='core.echo',
    after=[write],
    params={'text': '{{ steps.write.output.last.draft.text }}',
            'rounds': '{{ steps.write.output.iterations }}'},
)
