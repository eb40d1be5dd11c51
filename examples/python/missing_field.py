"""A document that asks a person for a missing field: a clerk supplies an invoice's IBAN.

The Python form of examples/missing-field.yaml: `workflow.to_dict()` equals that file parsed
(tests/definitions/test_builder.py)."""
from stepwise_client.builder import Workflow

workflow = Workflow(
    'missing-field',
    description="Extract an invoice's facts and ask a clerk for its IBAN when the document lacks one.",
    input_schema={'type': 'object',
                  'required': ['document_id', 'text'],
                  'properties': {'document_id': {'type': 'string'},
                                 'text': {'type': 'string', 'maxLength': 20000}}},
)
extract = workflow.agent(
    'extract',
    model='fast',
    prompt=('Extract the vendor, the total and the IBAN (empty if absent) of this invoice: '
            '{{ input.text }}'),
    output_schema={'type': 'object',
                   'required': ['vendor', 'total', 'iban'],
                   'properties': {'vendor': {'type': 'string'},
                                  'total': {'type': 'string'},
                                  'iban': {'type': 'string'}}},
    script=[{'when': "input.text.contains('IBAN')",
             'output': {'vendor': 'Acme Ltd', 'total': '1,240.00 EUR',
                        'iban': "{{ input.text.split('IBAN')[1].strip().split()[0] }}"}},
            {'output': {'vendor': 'Acme Ltd', 'total': '1,240.00 EUR', 'iban': ''}}],
)
ask_iban = workflow.human_input(
    'ask_iban',
    after=[extract],
    when="steps.extract.output.iban == ''",
    group='clerks',
    instructions=('The invoice {{ input.document_id }} from {{ steps.extract.output.vendor }} '
                  "names no IBAN. Find it in the vendor's records and enter it, or abstain if "
                  'you cannot.'),
    evidence={'document': '{{ input.text }}',
              'extracted': 'vendor {{ steps.extract.output.vendor }}, total '
                           '{{ steps.extract.output.total }}'},
    form={'type': 'object',
          'required': ['iban'],
          'properties': {'iban': {'type': 'string', 'title': 'IBAN', 'minLength': 15,
                                  'maxLength': 34, 'pattern': '^[A-Z]{2}[0-9]{2}[A-Z0-9]+$'},
                         'source': {'type': 'string', 'title': 'Where you found it',
                                    'enum': ['vendor master data', 'earlier invoice',
                                             'phone call']}}},
    allow_abstain=True,
    deadline_s=86400,
    escalate_to='finance_leads',
    escalate_after_s=14400,
    on_timeout='abstain',
)
workflow.tool(
    'store',
    tool='core.echo',
    after=[ask_iban],
    when='!steps.ask_iban.output.abstained',
    params={'document_id': '{{ input.document_id }}',
            'vendor': '{{ steps.extract.output.vendor }}',
            'iban': '{{ steps.ask_iban.output.answer.iban }}',
            'given_by': '{{ steps.ask_iban.output.answered_by }}'},
)
workflow.tool(
    'manual_handling',
    tool='core.echo',
    after=[ask_iban],
    when='steps.ask_iban.output.abstained',
    params={'document_id': '{{ input.document_id }}',
            'reason': 'no IBAN in the document, and the clerks could not supply one'},
)
workflow.tool(
    'store_found',
    tool='core.echo',
    after=[extract],
    when="steps.extract.output.iban != ''",
    params={'document_id': '{{ input.document_id }}',
            'vendor': '{{ steps.extract.output.vendor }}',
            'iban': '{{ steps.extract.output.iban }}'},
)
