"""Integrations end to end (docs/tools.md): read rows from a database, summarize them with an

The Python form of examples/orders-digest.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'orders-digest',
    description="Summarize a region's open orders into a file, announce it on RabbitMQ, e-mail it.",
    input_schema={'type': 'object',
                  'required': ['region'],
                  'additionalProperties': False,
                  'properties': {'region': {'type': 'string', 'enum': ['EU', 'US', 'APAC']}}},
    on_error='pause',
)
orders = workflow.tool(
    'orders',
    tool='sql.query',
    timeout_s=30,
    params={'connection': 'examples-warehouse',
            'statement': 'SELECT id, customer, total_usd, status FROM orders WHERE region = '
                         ":region AND status <> 'closed' ORDER BY id",
            'args': {'region': '{{ input.region }}'},
            'max_rows': 50},
)

summarize = workflow.agent(
    'summarize',
    model='fast',
    after=[orders],
    timeout_s=60,
    prompt=('Summarize these open orders of region {{ input.region }} for the operations team in '
            'two\n'
            'sentences: how many, how much in total, and which need attention.\n'
            '{{ steps.orders.output.rows | tojson }}\n'),
    output_schema={'type': 'object',
                   'required': ['headline', 'summary'],
                   'properties': {'headline': {'type': 'string', 'maxLength': 120},
                                  'summary': {'type': 'string'}}},
    script=[{'output': {'headline': '{{ steps.orders.output.row_count }} open orders in {{ '
                                    'input.region }}',
                        'summary': '{{ steps.orders.output.row_count }} orders are open in {{ '
                                   'input.region }}; {% for o in steps.orders.output.rows if '
                                   "o.status == 'on_hold' %}{{ o.id }} ({{ o.customer }}) is on "
                                   'hold. {% endfor %}'}}],
)

save = workflow.tool(
    'save',
    tool='files.write',
    after=[summarize],
    params={'connection': 'examples-files',
            'path': 'digests/orders-{{ input.region | lower }}.md',
            'content': '# {{ steps.summarize.output.headline }}\n'
                       '\n'
                       '{{ steps.summarize.output.summary }}\n'
                       '\n'
                       '| order | customer | total (USD) | status |\n'
                       '|---|---|---|---|\n'
                       '{% for o in steps.orders.output.rows %}| {{ o.id }} | {{ o.customer }} | '
                       '{{ o.total_usd }} | {{ o.status }} |\n'
                       '{% endfor %}\n'},
)

workflow.tool(
    'announce',
    tool='rabbitmq.publish',
    after=[save],
    retry={'max_attempts': 3, 'base_s': 2, 'max_s': 10, 'retry_on': ['transient', 'timeout']},
    params={'connection': 'examples-rabbitmq',
            'exchange': 'amq.topic',
            'routing_key': 'stepwise.examples.orders-digest.{{ input.region | lower }}',
            'message': {'headline': '{{ steps.summarize.output.headline }}',
                        'file': '{{ steps.save.output.path }}',
                        'sha256': '{{ steps.save.output.sha256 }}'}},
)

workflow.tool(
    'notify',
    tool='mail.send',
    after=[save],
    params={'connection': 'examples-mail',
            'to': ['ops@example.com'],
            'allowed_domains': ['example.com'],
            'subject': '{{ steps.summarize.output.headline }}',
            'body': '{{ steps.summarize.output.summary }}\n'
                    '\n'
                    'The digest is in {{ steps.save.output.path }} (sha256 {{ '
                    'steps.save.output.sha256 }}).\n'},
)
