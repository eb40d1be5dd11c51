"""The egress policy the test suite runs under: the default, plus loopback on any port.

Local servers stand in for the outside world (http_sink, fake_llm, slow or huge servers) and
listen on 127.0.0.1 at a random port, which the default policy refuses. The suite allows them
explicitly, the way an operator would (`allow_networks`), in this process (tests/conftest.py)
and in the real worker processes the integration tests start (tests/integration/conftest.py);
the default policy itself is unchanged, and the egress tests set their own.
"""
import json

LOCAL_SERVERS = {"default": {"allow_networks": ["127.0.0.0/8", "::1/128"], "ports": "*"}}


def local_servers_env() -> str:
    """STEPWISE_EGRESS for a worker process of the test suite."""
    return json.dumps(LOCAL_SERVERS)
