"""Fixtures for trigger tests: the support workflow, a movable clock, and signed deliveries."""
import json
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.engine import clock
from orchestrator.engine.services.workflows import workflow_save
from tests.factories import SETUP, example_definition
from triggers.services.config import trigger_create
from triggers.signatures import sign

# A schedule's input template: each slot's run names its slot.
DIGEST = {"ticket_id": "digest-{{ slot }}", "body": "Daily digest at {{ slot }}",
          "customer_email": "ops@example.com"}

SUPPORT_TEMPLATE = {"ticket_id": "{{ payload.ticket }}", "body": "{{ payload.text }}",
                    "customer_email": "{{ payload.email }}"}
TICKET = {"ticket": "T-7", "text": "My invoice is wrong", "email": "c@example.com"}


@pytest.fixture
def support(team):
    version, _ = workflow_save(team=team, definition=example_definition("support"), actor=SETUP)
    return version


class Clock:
    """`orchestrator.engine.clock.now` under the test's control."""

    def __init__(self, start: datetime):
        self.moment = start

    def __call__(self) -> datetime:
        return self.moment

    def advance(self, **delta) -> datetime:
        self.moment += timedelta(**delta)
        return self.moment


@pytest.fixture
def frozen(monkeypatch):
    moment = Clock(datetime.now(UTC).replace(microsecond=0))
    monkeypatch.setattr(clock, "_source", moment)
    return moment


def make_trigger(team, kind: str, name: str = "inbox", **values):
    values.setdefault("workflow", "support-reply")
    if kind in ("webhook", "queue", "api"):
        values.setdefault("input_template", SUPPORT_TEMPLATE)
    return trigger_create(team=team, kind=kind, name=name, actor=SETUP, **values)


def deliver(client, trigger, secret: str, body=None, *, delivery: str = "d-1",
            timestamp: int | None = None, signature: str | None = None, **headers):
    """POST a signed delivery to the webhook, the way a sender would."""
    raw = body if isinstance(body, bytes) else json.dumps(TICKET if body is None else body).encode()
    stamp = int(clock.now().timestamp()) if timestamp is None else timestamp
    signature = sign(secret, delivery, stamp, raw) if signature is None else signature
    return client.post(f"/api/v1/hooks/{trigger.id}/", data=raw, content_type="application/json",
                       HTTP_WEBHOOK_ID=delivery, HTTP_WEBHOOK_TIMESTAMP=str(stamp),
                       HTTP_WEBHOOK_SIGNATURE=signature, **headers)
