"""Routers: a score threshold picks one branch; the branches not chosen are skipped.

The Python form of examples/lead-routing.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'lead-routing',
    description='Score a sales lead and route it to sales, nurturing or the archive.',
    input_schema={'type': 'object',
                  'required': ['company', 'score'],
                  'properties': {'company': {'type': 'string'},
                                 'score': {'type': 'number', 'minimum': 0, 'maximum': 1}}},
)
route = workflow.router(
    'route',
    strategy='score',
    score='input.score',
    routes=[{'name': 'hot', 'min': 0.8, 'then': ['notify_sales']},
            {'name': 'warm', 'min': 0.5, 'then': ['nurture']}],
    default={'name': 'cold', 'then': ['archive']},
)

notify_sales = workflow.tool(
    'notify_sales',
    tool='core.echo',
    after=[route],
    params={'message': 'Call {{ input.company }} today'},
)

nurture = workflow.agent(
    'nurture',
    model='fast',
    after=[route],
    prompt='Write a short nurture email for {{ input.company }}.',
    output_schema={'type': 'object',
                   'required': ['email'],
                   'properties': {'email': {'type': 'string'}}},
    script=[{'output': {'email': 'Hello {{ input.company }}, here is what is new this month.'}}],
)

archive = workflow.tool(
    'archive',
    tool='core.echo',
    after=[route],
    params={'archived': '{{ input.company }}'},
)

workflow.tool(
    'report',
    tool='core.echo',
    after=[notify_sales, nurture, archive],
    join='any',
    params={'route': '{{ steps.route.output.route }}'},
)
