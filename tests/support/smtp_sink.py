"""A real local SMTP server (aiosmtpd) standing in for a mail relay in tests.

It keeps every message it accepted (answered 250 to), can answer the next messages with an
SMTP error instead (`fail_next(1, "421 4.7.0 Try again later")`), require a login
(`require_auth`), or hold a message at the end of DATA without answering (`hold()`) so a test
can kill the sending worker: a message whose sender went away before the answer is not
accepted, as a relay that never sent 250 has not taken it.
"""
import asyncio
import threading
import time
from email import message_from_bytes

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from .integrations import closed_port as free_port


class SmtpSink:
    def __init__(self):
        self.messages: list = []  # email.message.Message, accepted
        self.arrived = 0  # messages whose DATA ended, accepted or not
        self.failures: list[str] = []
        self.holding = threading.Event()  # set: hold the next message unanswered
        self.released = threading.Event()
        self.credentials: tuple[str, str] | None = None
        sink = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                sink.arrived += 1
                if sink.failures:
                    return sink.failures.pop(0)
                if sink.holding.is_set():
                    sink.holding.clear()
                    while not sink.released.is_set():
                        await asyncio.sleep(0.05)
                    if server.transport is None or server.transport.is_closing():
                        return "451 4.3.0 sender went away"  # nobody hears it
                    await asyncio.sleep(0.2)  # a closed peer may take a moment to show
                    if server.transport is None or server.transport.is_closing():
                        return "451 4.3.0 sender went away"
                message = message_from_bytes(envelope.content)
                message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
                sink.messages.append(message)
                return "250 2.0.0 accepted"

        def authenticate(server, session, envelope, mechanism, auth_data):
            ok = (isinstance(auth_data, LoginPassword) and sink.credentials is not None
                  and (auth_data.login.decode(), auth_data.password.decode()) == sink.credentials)
            return AuthResult(success=ok, handled=False)

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port,
                                     authenticator=authenticate, auth_require_tls=False,
                                     auth_required=False)

    def __enter__(self):
        self.controller.start()
        return self

    def __exit__(self, *exc):
        self.released.set()
        self.controller.stop()

    def fail_next(self, count: int, reply: str) -> None:
        self.failures.extend([reply] * count)

    def require_auth(self, username: str, password: str) -> None:
        self.credentials = (username, password)
        self.controller.SMTP_kwargs["auth_required"] = True  # for the connections after this

    def hold(self) -> None:
        self.released.clear()
        self.holding.set()

    def release(self) -> None:
        self.released.set()

    def wait_arrived(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.arrived < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} message(s) did not arrive in {timeout}s")
            time.sleep(0.05)
