"""Fan-out/fan-in: summarize every document in parallel (a Celery chord), then combine.

The Python form of examples/document-digest.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'document-digest',
    description='Summarize documents in parallel and merge the summaries into one digest.',
    input_schema={'type': 'object',
                  'required': ['documents'],
                  'properties': {'documents': {'type': 'array',
                                               'minItems': 1,
                                               'maxItems': 100,
                                               'items': {'type': 'object',
                                                         'required': ['id', 'text'],
                                                         'properties': {'id': {'type': 'string'},
                                                                        'text': {'type': 'string'}}}}}},
)
summarize = workflow.map(
    'summarize',
    over='input.documents',
    merge='list',
    item={'type': 'agent',
          'model': 'fast',
          'prompt': 'Summarize document {{ item.id }}: {{ item.text }}',
          'output_schema': {'type': 'object',
                            'required': ['id', 'summary'],
                            'properties': {'id': {'type': 'string'},
                                           'summary': {'type': 'string'}}},
          'script': [{'output': {'id': '{{ item.id }}', 'summary': '{{ item.text[:60] }}'}}]},
)

workflow.tool(
    'digest',
    tool='core.echo',
    after=[summarize],
    params={'title': 'Digest of {{ input.documents | length }} documents',
            'summaries': '{% for s in steps.summarize.output %}- {{ s.id }}: {{ s.summary }}\n'
                         '{% endfor %}'},
)
