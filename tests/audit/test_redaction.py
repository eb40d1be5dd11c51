"""Redaction: sensitive fields and secrets never reach the ledger in clear text."""
import json

import pytest
from django.db import transaction

from audit.chain import CONTENT_FIELDS
from audit.models import AuditEntry
from audit.redaction import Policy, Redactor, is_secret_key, keyed_hash, summary_of
from audit.services import audit_record
from orchestrator.engine.services.runs import run_start
from orchestrator.engine.services.workflows import workflow_save
from orchestrator.models import Run, StepRun
from tests.factories import SETUP

from .conftest import (
    SENSITIVE,
    SUPPORT_INPUT,
    finished_support_run,
    ledger,
    support_definition,
    work,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("key, secret", [
    ("password", True), ("db_password", True), ("Authorization", True),
    ("Proxy-Authorization", True), ("api_key", True), ("X-Api-Key", True), ("apiKey", True),
    ("access_token", True), ("refreshToken", True), ("csrftoken", True), ("client_secret", True),
    ("Set-Cookie", True), ("cookies", True), ("private_key", True), ("sessionid", True),
    ("tokens_in", False), ("tokens_out", False), ("max_tokens", False), ("idempotency_key", False),
    ("secretary", False), ("keys", False), ("customer_email", False), ("body", False),
])
def test_secret_keys_are_recognised_by_their_words(key, secret):
    assert is_secret_key(key) is secret


def test_secret_values_are_hidden_wherever_they_are():
    redactor = Redactor(Policy())
    scrubbed = redactor.scrub({
        "headers": {"Authorization": "Bearer abc.def.ghi", "Accept": "application/json"},
        "nested": [{"password": "hunter22"}],
        "text": "called with Bearer sk-abcdefghijklmnopqrstu and AKIAABCDEFGHIJKLMNOP",
    })
    text = json.dumps(scrubbed)

    for secret in ("abc.def.ghi", "hunter22", "sk-abcdefghijklmnopqrstu", "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in text
    assert scrubbed["headers"]["Accept"] == "application/json"
    assert scrubbed["headers"]["Authorization"] == {"redacted": keyed_hash("Bearer abc.def.ghi"),
                                                    "summary": "***"}


def test_a_sensitive_path_becomes_a_keyed_hash_and_a_masked_summary():
    policy = Policy.of({"audit": {"sensitive": ["input.customer_email", "input.docs.*.text"]}})
    data = {"customer_email": "carol@example.com", "ticket": "T-1",
            "docs": [{"id": 1, "text": "secret contract"}, {"id": 2, "text": "another"}]}
    redactor = Redactor.for_namespace(policy, {"input": data, "steps": {}})

    redacted = redactor.content(data, ("input",))

    assert redacted["customer_email"] == {"redacted": keyed_hash("carol@example.com"),
                                          "summary": "c***@example.com"}
    assert redacted["ticket"] == "T-1"
    assert [d["text"]["summary"] for d in redacted["docs"]] == ["s*** (15 chars)", "a*** (7 chars)"]
    assert redacted["docs"][0]["id"] == 1
    # The same value inside free text is found and replaced too.
    assert redactor.scrub("mail carol@example.com now") == (
        f"mail [redacted {keyed_hash('carol@example.com')[:28]}] now")


def test_the_keyed_hash_is_stable_but_not_a_plain_sha256():
    import hashlib

    assert keyed_hash("carol@example.com") == keyed_hash("carol@example.com")
    assert keyed_hash("carol@example.com").removeprefix("hmac-sha256:") != hashlib.sha256(
        b"carol@example.com").hexdigest()


@pytest.mark.parametrize("value, summary", [
    ("carol@example.com", "c***@example.com"), ("hello", "h*** (5 chars)"), ("", "(empty)"),
    (42, "<number>"), (True, "<bool>"), ({"a": 1}, "<object, 1 keys>"), ([1, 2], "<list, 2 items>"),
])
def test_summaries_say_what_kind_of_value_it_was(value, summary):
    assert summary_of(value) == summary


def everything_stored(run: Run) -> str:
    """Every column of every entry of the run, as one text."""
    return "\n".join(json.dumps({f: str(getattr(e, f)) for f in CONTENT_FIELDS})
                     for e in ledger(run_id=run.id))


def test_redacted_fields_never_appear_in_clear_text(team, requester, approver):
    run = finished_support_run(team, requester, approver,
                               definition=support_definition(sensitive=SENSITIVE),
                               note="Reply to carol.customer@example.com today")
    reply = StepRun.objects.get(run=run, name="draft").output["reply"]
    stored = everything_stored(run)

    assert run.state == "completed"
    assert SUPPORT_INPUT["customer_email"] not in stored  # in the input, the params, the note
    assert reply not in stored  # in the draft's output, the gate's instructions, the e-mail body
    created = ledger(run_id=run.id, action="run.created")[0]
    assert created.data["input"]["customer_email"]["summary"] == "c***@example.com"
    assert created.data["input"]["ticket_id"] == "T-7"  # what is not sensitive stays readable
    send = [e for e in ledger(run_id=run.id, action="external_call.authorized") if e.step_name == "send"][0]
    assert send.data["request"]["subject"] == "Re: ticket T-7"
    assert "[redacted hmac-sha256:" in send.data["request"]["to"]


def test_without_the_audit_section_only_secrets_are_redacted(support_run):
    created = ledger(run_id=support_run.id, action="run.created")[0]
    assert created.data["input"] == SUPPORT_INPUT


def test_prompts_and_documents_are_stored_by_reference_when_the_workflow_says_so(team, requester, approver):
    run = finished_support_run(team, requester, approver,
                               definition=support_definition(store_prompts="reference"))
    stored = everything_stored(run)

    assert "Please refund my invoice" not in stored  # the ticket body: input and prompts
    assert SUPPORT_INPUT["customer_email"] not in stored
    created = ledger(run_id=run.id, action="run.created")[0]
    assert created.data["input"] == {"ref": f"orchestrator.run:{run.id}#input",
                                     "hash": keyed_hash(json.loads(json.dumps(SUPPORT_INPUT)))}
    call = ledger(run_id=run.id, action="external_call.authorized")[0]
    assert call.data["request"]["ref"].startswith("orchestrator.workflowversion:")
    assert created.data["policy"]["audit"]["store_prompts"] == "reference"


def test_secrets_in_tool_params_never_reach_the_ledger(team):
    from tests.support.http_sink import HttpSink

    with HttpSink() as sink:
        version, _ = workflow_save(team=team, definition={
            "name": "with-secret", "input_schema": {"type": "object"}, "steps": [{
                "name": "call", "type": "tool", "tool": "http.request",
                "params": {"method": "POST", "url": f"{sink.url}/x",
                           "headers": {"Authorization": "Bearer s3cr3t-t0ken-value"},
                           "json": {"password": "hunter2!", "user": "bob"}}}]}, actor=SETUP)
        run = work(run_start(version=version, input={}, actor=SETUP))

    assert run.state == "completed"
    stored = everything_stored(run)
    assert "s3cr3t-t0ken-value" not in stored and "hunter2!" not in stored
    call = ledger(run_id=run.id, action="external_call.authorized")[0]
    assert call.data["request"]["json"]["user"] == "bob"


def test_payloads_recorded_by_other_features_are_redacted_too():
    with transaction.atomic():
        entry = audit_record(action="budget.raised", actor="user:alice", subject_type="budget",
                             subject_id="b1", payload={"headers": {"Cookie": "session=abc123"}})
    assert "abc123" not in AuditEntry.objects.get(id=entry.id).payload
