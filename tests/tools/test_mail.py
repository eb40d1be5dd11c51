"""`mail.send` through Django's mail framework to a real local SMTP server: the message and its
Message-ID, the allowed domains, and every error class."""
import pytest

from orchestrator.integrations.tools.named import message_id
from tests.support.integrations import closed_port
from tests.support.smtp_sink import SmtpSink

from .conftest import call, fails


@pytest.fixture
def sink(connections, monkeypatch, tmp_path):
    monkeypatch.setenv("INTEGRATIONS_SMTP_PW", "right")
    with SmtpSink() as sink:
        base = {"kind": "mail", "host": "127.0.0.1", "port": sink.port,
                "from_email": "stepwise@example.com", "timeout_s": 5}
        connections(
            relay={**base, "allowed_domains": ["example.com", "partner.test"]},
            open_relay={**base},
            login={**base, "username": "stepwise", "password": {"env": "INTEGRATIONS_SMTP_PW"},
                   "allowed_domains": ["example.com"]},
            wrong_login={**base, "username": "stepwise", "password": {"env": "HOME"},
                         "allowed_domains": ["example.com"]},
            down={**base, "port": closed_port(), "allowed_domains": ["example.com"]},
            files={"kind": "mail", "backend": "file", "path": str(tmp_path / "mail"),
                   "from_email": "stepwise@example.com", "allowed_domains": ["example.com"]})
        yield sink


def mail(**params):
    return {"connection": "relay", "to": ["ann@example.com"], "subject": "Your refund",
            "body": "It is on its way.", **params}


def test_a_message_is_sent_with_the_message_id_of_its_idempotency_key(sink):
    key = "run-4:send:default"
    out = call("mail.send", mail(cc=["bo@partner.test"], html="<p>It is on its way.</p>"), key=key)
    assert out == {"message_id": f"<{message_id(key)}@example.com>", "recipients": 2}
    (message,) = sink.messages
    assert message["Message-ID"] == out["message_id"]
    assert message["Subject"] == "Your refund" and message["From"] == "stepwise@example.com"
    assert message["X-Envelope-To"] == "ann@example.com, bo@partner.test"
    assert message.is_multipart()


@pytest.mark.parametrize("params, why", [
    (mail(to=["eve@evil.test"]), "'eve@evil.test' outside the allowed domains"),
    (mail(bcc=["ann@example.com.evil.test"]), "outside the allowed domains"),
    (mail(allowed_domains=["partner.test"]), "'ann@example.com' outside"),  # both lists apply
    (mail(connection="open_relay"), "no allowed_domains are declared"),
])
def test_a_recipient_outside_the_allowed_domains_stops_the_whole_message(sink, params, why):
    error = fails("policy", "mail.send", params)
    assert why in error.message
    assert sink.arrived == 0


def test_the_step_may_narrow_but_not_widen_the_connections_domains(sink):
    call("mail.send", mail(to=["bo@partner.test"], allowed_domains=["partner.test"]))
    fails("policy", "mail.send", mail(to=["cy@other.test"], allowed_domains=["other.test"]))
    assert len(sink.messages) == 1


@pytest.mark.parametrize("reply, error_class", [
    ("421 4.7.0 Too many messages, slow down", "rate_limit"),
    ("451 4.3.0 Local error, try again", "transient"),
    ("550 5.1.1 Mailbox unavailable", "permanent"),
])
def test_smtp_answers_are_classified(sink, reply, error_class):
    sink.fail_next(1, reply)
    fails(error_class, "mail.send", mail())
    assert sink.messages == []


def test_a_login_the_server_refuses_is_auth_and_the_right_one_sends(sink):
    sink.require_auth("stepwise", "right")
    error = fails("auth", "mail.send", mail(connection="wrong_login"))
    assert "right" not in error.message
    call("mail.send", mail(connection="login"))
    assert len(sink.messages) == 1


def test_an_unreachable_server_is_transient(sink):
    fails("transient", "mail.send", mail(connection="down"))


def test_the_file_backend_writes_the_message_for_development(sink, tmp_path):
    out = call("mail.send", mail(connection="files"), key="run-7:send:default")
    (written,) = (tmp_path / "mail").iterdir()
    assert f"Message-ID: {out['message_id']}" in written.read_text()
