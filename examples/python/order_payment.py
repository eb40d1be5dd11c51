"""An order that waits for its payment confirmation, then ships; released if none comes.

The Python form of examples/order-payment.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'order-payment',
    description=("Reserve an order's stock, wait up to a day for its payment confirmation, then "
                 'ship it; release the stock if no payment comes.'),
    input_schema={'type': 'object',
                  'required': ['order_id', 'amount'],
                  'properties': {'order_id': {'type': 'string'},
                                 'amount': {'type': 'number', 'exclusiveMinimum': 0}}},
)
reserve = workflow.tool(
    'reserve_stock',
    tool='core.echo',
    side_effect=True,
    params={'order': '{{ input.order_id }}', 'action': 'reserve'},
)

payment = workflow.wait(
    'payment',
    after=[reserve],
    description="The payment provider's confirmation of this order.",
    signal='payment_confirmed',
    schema={'type': 'object', 'required': ['amount'],
            'properties': {'amount': {'type': 'number'}}},
    correlation_key='{{ input.order_id }}',
    timeout_s=86400,
    on_timeout='release_stock',
)

workflow.tool(
    'ship',
    tool='core.echo',
    after=[payment],
    side_effect=True,
    params={'order': '{{ input.order_id }}', 'paid': '{{ steps.payment.output.amount }}'},
)

workflow.tool(
    'release_stock',
    tool='core.echo',
    after=[payment],
    side_effect=True,
    params={'order': '{{ input.order_id }}', 'action': 'release'},
)
