"""The one notification service: recorded with the change it reports, delivered after commit
by e-mail (Django's mail framework) and an outgoing Slack-compatible webhook (through the
egress policy), each channel once, failures retried."""
import json

import pytest
from django.core import mail
from django.db import transaction

from notifications.delivery import notification_deliver
from notifications.models import Notification
from notifications.services import MAX_ATTEMPTS, notification_send, notifications_resend
from orchestrator.engine import clock
from tests.support.http_sink import HttpSink

pytestmark = pytest.mark.django_db

SAY = {"kind": "test.event", "subject": "Something happened", "body": "Run 1 needs you.",
       "link": "https://stepwise.example/admin/x/"}


def test_a_notification_is_sent_only_once_its_transaction_commits(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as kept:
        notification_send(**SAY, recipients=["a@example.com"])
    with django_capture_on_commit_callbacks() as dropped, pytest.raises(RuntimeError):
        with transaction.atomic():
            notification_send(**SAY, recipients=["b@example.com"])
            raise RuntimeError("the change failed")

    assert len(kept) == 1 and dropped == []
    assert [n.recipients for n in Notification.objects.all()] == [["a@example.com"]]


def test_nothing_to_say_or_nobody_to_tell_sends_nothing(settings):
    settings.STEPWISE_NOTIFY_WEBHOOK_URL = ""
    with pytest.raises(ValueError):
        notification_send(**{**SAY, "body": " "}, recipients=["a@example.com"])
    assert notification_send(**SAY, recipients=[]) is None
    assert Notification.objects.count() == 0


def test_email_goes_to_each_recipient_alone_and_the_webhook_gets_a_slack_payload(settings):
    with HttpSink() as sink:
        settings.STEPWISE_NOTIFY_WEBHOOK_URL = f"{sink.url}/hooks/approvals"
        notice = notification_send(**SAY, recipients=["b@example.com", "a@example.com"], team="support")

        assert notification_deliver(notification_id=notice.id)

    assert [m.to for m in mail.outbox] == [["a@example.com"], ["b@example.com"]]
    assert mail.outbox[0].subject == "Something happened"
    assert mail.outbox[0].body == "Run 1 needs you.\n\nhttps://stepwise.example/admin/x/\n"
    [posted] = sink.requests
    assert posted["path"] == "/hooks/approvals"
    assert json.loads(posted["body"]) == {"text": "*Something happened*\nRun 1 needs you.\n"
                                                  "<https://stepwise.example/admin/x/|Open in Stepwise>"}
    notice.refresh_from_db()
    assert notice.status == "sent" and notice.attempts == 1
    assert notification_deliver(notification_id=notice.id)  # a replay sends nothing again
    assert len(mail.outbox) == 2 and len(sink.requests) == 1


def test_a_webhook_the_egress_policy_refuses_is_retried_without_resending_the_email(settings, monkeypatch):
    with HttpSink() as sink:
        settings.STEPWISE_NOTIFY_WEBHOOK_URL = f"{sink.url}/hooks"
        settings.STEPWISE_EGRESS = {}  # the default policy: loopback is not allowed
        notice = notification_send(**SAY, recipients=["a@example.com"])

        assert not notification_deliver(notification_id=notice.id)
        notice.refresh_from_db()
        assert notice.status == "pending" and notice.email_sent_at is not None
        assert "webhook: EgressRefused" in notice.error and sink.requests == []

        settings.STEPWISE_EGRESS = {"default": {"allow_networks": ["127.0.0.0/8"], "ports": "*"}}
        later = notice.next_attempt_at
        monkeypatch.setattr(clock, "_source", lambda: later)
        assert notification_deliver(notification_id=notice.id)

    assert len(mail.outbox) == 1 and len(sink.requests) == 1
    notice.refresh_from_db()
    assert (notice.status, notice.attempts, notice.error) == ("sent", 2, "")


def test_a_notification_that_keeps_failing_ends_failed(settings):
    settings.STEPWISE_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/nobody-listens"
    notice = notification_send(**SAY)
    for _ in range(MAX_ATTEMPTS):
        notification_deliver(notification_id=notice.id)
    notice.refresh_from_db()
    assert (notice.status, notice.attempts) == ("failed", MAX_ATTEMPTS)


def test_the_sweep_sends_due_notifications_again(django_capture_on_commit_callbacks, monkeypatch):
    notice = notification_send(**SAY, recipients=["a@example.com"])
    assert notifications_resend() == 0  # not due yet: its first message is on its way

    due = notice.next_attempt_at
    monkeypatch.setattr(clock, "_source", lambda: due)
    with django_capture_on_commit_callbacks() as sent:
        assert notifications_resend() == 1
    assert len(sent) == 1
