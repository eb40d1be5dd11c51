"""The save-time check of a definition's tool calls against the named connections.

Owns `definition_checker(team=...)`: for each tool call whose tool takes a named connection
(`connection` in the tool registry), the `connection` param must be literal, name a connection
that exists, is of the tool's kind and is granted to the team; then the tool's own `check`
compares the literal params with that connection (a write on a read-only connection, an
exchange or topic it does not allow, a recipient outside the allowed domains, a templated SQL
statement). Each problem is (path inside the params, message); the definition validator puts
it under the step's path. Reads settings only, never the network.
"""
from collections.abc import Iterator

from orchestrator.engine.definitions import contains_template

from ..connections import ConnectionRefused, connection_get
from .registry import all_tools

Problems = Iterator[tuple[tuple, str]]


def definition_checker(*, team: str = ""):
    """A checker of one tool call's params for `team`'s definitions."""
    tools = all_tools()

    def check(tool_name: str, params: dict) -> Problems:
        registered = tools.get(tool_name)
        if registered is None or not isinstance(params, dict):
            return
        connection = None
        if registered.connection:
            name = params.get("connection")
            if name is None:
                return  # the params schema reports the missing param
            if not isinstance(name, str) or contains_template(name):
                yield ("connection",), ("connection must name a connection literally, not "
                                        "through a template")
                return
            try:
                connection = connection_get(name, kind=registered.connection, team=team)
            except ConnectionRefused as refused:
                yield ("connection",), refused.message
                return
        if registered.check is not None:
            yield from registered.check(params, connection)

    return check
