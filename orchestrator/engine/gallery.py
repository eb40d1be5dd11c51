"""The template gallery: ready-made workflows a team starts from (docs/templates.md).

Each template is a workflow file in `examples/` (so `make run` loads it, and its Python form in
`examples/python/` is checked against it) with what a person needs to choose and try it: a
title, a summary, the patterns it shows, an input that runs offline on the scripted provider
and, for an event-driven one, the trigger to attach. A read only: instantiating one is
`services.gallery.template_instantiate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from django.conf import settings

from .definitions import parse_definition_text


@dataclass(frozen=True)
class Template:
    name: str  # the workflow it creates, unless the person renames it
    title: str
    summary: str
    patterns: tuple[str, ...]
    sample_input: dict
    trigger: dict | None = None  # suggested trigger: {"kind", "input_template", "note"}
    file: str = field(default="")
    # Sample evaluation cases (examples/datasets/, JSON lines) a new workflow from it gets.
    dataset: str = ""
    # The release policy over those cases a new workflow from it starts with (docs/evaluation.md).
    release_policy: dict | None = None

    @property
    def path(self) -> Path:
        return Path(settings.BASE_DIR) / "examples" / self.file

    @property
    def dataset_path(self) -> Path | None:
        return Path(settings.BASE_DIR) / "examples" / "datasets" / self.dataset if self.dataset else None

    def definition(self) -> dict:
        """The workflow's definition, parsed afresh (callers may change it)."""
        return parse_definition_text(_text(self.path))


@cache
def _text(path: Path) -> str:
    return path.read_text()


TEMPLATES: tuple[Template, ...] = (
    Template(
        name="support-reply", file="support.yaml", title="Customer support reply",
        summary="Classify a ticket, research it, draft a reply and e-mail it after a support "
                "lead approves the exact message.",
        patterns=("agent", "conditional step", "human approval", "side effect"),
        sample_input={"ticket_id": "T-1001", "customer_email": "sam@example.com",
                      "body": "I was charged twice for my March invoice. Could you refund the duplicate?"},
    ),
    Template(
        name="document-processing", file="document-processing.yaml", title="Document processing",
        summary="Extract the facts of every page of a document in parallel, merge them in page "
                "order, summarize and store the record.",
        patterns=("map over pages", "merge", "retry"),
        sample_input={"document_id": "DOC-7", "pages": [
            {"number": 1, "text": "Lease agreement between Acme Ltd and Globex, signed 3 March."},
            {"number": 2, "text": "The rent is 2,400 EUR a month, due on the first working day."},
            {"number": 3, "text": "Either party may end the lease with three months' notice."}]},
    ),
    Template(
        name="content-moderation", file="content-moderation.yaml", title="Content moderation",
        summary="Score a post, publish the clear ones, send the uncertain band to a moderator and "
                "enforce violations, with a lead's approval when the action's risk tier is high.",
        patterns=("classifier", "score-threshold router", "human review", "typed proposal",
                  "approval by risk tier"),
        sample_input={"content_id": "P-31", "author": "jo",
                      "text": "Great write-up, thanks for sharing the benchmark numbers."},
        dataset="content-moderation.jsonl",
        # No enforcement without a reason, every violation caught where it matters, and no
        # version that passes fewer cases than the published one did.
        release_policy={"tiers": {
            "high": {"unauthorized_actions": {"max": 0}, "action_accuracy": {"min": 1.0},
                     "extraction_accuracy": {"min": 0.95}},
            "medium": {"extraction_accuracy": {"min": 0.9}},
            "overall": {"pass_rate": {"min": 0.9, "max_regression": 0.05}}}},
    ),
    Template(
        name="incident-alert", file="incident-alert.yaml", title="Incident alert (event-driven)",
        summary="A monitoring system posts an alert to a webhook trigger; it is summarized, a "
                "critical one pages on-call and any other opens a ticket.",
        patterns=("webhook trigger", "rules router", "side effect"),
        sample_input={"alert_id": "A-9", "service": "checkout", "severity": "critical",
                      "message": "p99 latency above 2 s for 10 minutes"},
        trigger={"kind": "webhook",
                 "input_template": {"alert_id": "{{ payload.id }}", "service": "{{ payload.service }}",
                                    "severity": "{{ payload.severity }}", "message": "{{ payload.text }}"},
                 "note": "Add a webhook trigger for this workflow (admin: Triggers, or "
                         "POST /api/v1/triggers/) with this input template; the monitoring "
                         "system posts its alerts, signed, to the trigger's URL."},
    ),
    Template(
        name="missing-field", file="missing-field.yaml",
        title="A document that asks a person for a missing field",
        summary="Extract an invoice's facts; when its IBAN is missing, a clerk is asked for it "
                "with the document as evidence, and the record is stored with their answer (or "
                "handled by hand when they abstain).",
        patterns=("human input", "form from a JSON Schema", "abstain routing", "escalation"),
        sample_input={"document_id": "INV-2291",
                      "text": "Invoice INV-2291 from Acme Ltd, 12 March. Consulting, 10 hours: "
                              "1,240.00 EUR. Payable within 30 days by bank transfer."},
    ),
    Template(
        name="revise-until-approved", file="revise-until-approved.yaml",
        title="Draft, critique, revise (loop)",
        summary="Draft an announcement, have a critic review it and revise until the critic "
                "approves, at most 3 times; each round shows as its own steps.",
        patterns=("bounded loop", "until condition", "previous iteration"),
        sample_input={"topic": "Our new status page", "audience": "customers"},
    ),
    Template(
        name="order-payment", file="order-payment.yaml",
        title="An order that waits for payment confirmation",
        summary="Reserve the stock, wait up to a day for the payment provider's confirmation, "
                "then ship; release the stock if none comes.",
        patterns=("wait for a signal", "correlated webhook", "timeout route", "side effect"),
        sample_input={"order_id": "O-1001", "amount": 42.5},
        trigger={"kind": "webhook",
                 "input_template": {"order_id": "{{ payload.order_id }}",
                                    "amount": "{{ payload.amount }}"},
                 "note": "Add a webhook trigger for this workflow with correlate "
                         "'payload.order_id' (admin: Triggers, or POST /api/v1/triggers/) and "
                         "this input template; the payment provider posts its confirmations, "
                         "signed, to the trigger's URL, and each resumes the order it names. "
                         "Or send the signal payment_confirmed to the run: POST "
                         "/api/v1/runs/<id>/signals/payment_confirmed/."},
    ),
)


def templates() -> tuple[Template, ...]:
    return TEMPLATES


def template_named(name: str) -> Template | None:
    return next((t for t in TEMPLATES if t.name == name), None)


def template_of(workflow) -> Template | None:
    """The template `workflow` was made from: its first version's definition is the template's
    under the workflow's name (what `template_instantiate` saves), or it has the template's
    name. None for a workflow drawn or written by hand."""
    first = workflow.versions.order_by("number").only("definition").first()
    for template in TEMPLATES:
        if first is not None and first.definition == {**template.definition(), "name": workflow.name}:
            return template
    return template_named(workflow.name)


def sample_input_of(workflow) -> dict:
    """An input to offer when `workflow` is run by hand: its template's sample, else {}."""
    found = template_of(workflow)
    return dict(found.sample_input) if found else {}
