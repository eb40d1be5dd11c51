"""Code scorers: checks written in Python, registered by name, that a case or an evaluation names.

    from evaluation.scorers import scorer

    @scorer("refund_within_total")
    def refund_within_total(outcome, expected, case):
        action = outcome["steps"]["propose"]["action"] or {}
        return action.get("params", {}).get("amount_usd", 0) <= 100

A scorer takes the case's outcome, its expected outcome and the case ({"key", "input",
"risk_tier", "tags"}) and returns True/False (a proportion metric), a number (a mean metric) or
None (it does not apply to this case); its metric is `scorer:<name>`. The modules that register
scorers are named in the setting STEPWISE_EVALUATION_SCORERS and imported the first time the
registry is read, in every process (web, workers), so a name means the same everywhere.

This module holds the registry only and imports nothing of the project; scoring a case is
`evaluation.scoring`'s.
"""
import importlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

Scorer = Callable[[dict, dict, dict], "bool | int | float | None"]


@dataclass(frozen=True)
class Registered:
    name: str
    function: Scorer
    #: "higher" (the default) or "lower": which way a number (or True) is better.
    better: str = "higher"


_registry: dict[str, Registered] = {}
_imported: set[str] = set()  # the modules of STEPWISE_EVALUATION_SCORERS imported so far
_lock = threading.Lock()


def scorer(name: str, *, better: str = "higher") -> Callable[[Scorer], Scorer]:
    """Register the decorated function as the code scorer `name` (lowercase letters, digits and
    `_`, starting with a letter). Raises ValueError for a bad name, an unknown direction or a
    name already registered to another function."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"a scorer's name is 1 to 64 lowercase letters, digits and _, starting with a letter: {name!r}")
    if better not in ("higher", "lower"):
        raise ValueError(f"better is 'higher' or 'lower', not {better!r}")

    def register(function: Scorer) -> Scorer:
        with _lock:
            known = _registry.get(name)
            if known is not None and _qualname(known.function) != _qualname(function):
                raise ValueError(f"the scorer {name!r} is already registered ({_qualname(known.function)})")
            _registry[name] = Registered(name, function, better)
        return function

    return register


def unregister(name: str) -> None:
    """Forget the scorer `name` (a test's own scorer, once the test is over)."""
    with _lock:
        _registry.pop(name, None)


def registered() -> dict[str, Registered]:
    """Every registered scorer by name, once the modules named in STEPWISE_EVALUATION_SCORERS are
    imported. Raises ImportError for a module that cannot be imported (a misconfiguration)."""
    _load()
    return dict(_registry)


def get(name: str) -> Registered | None:
    return registered().get(name)


def better_of(name: str) -> str:
    found = _registry.get(name)
    return found.better if found is not None else "higher"


def _load() -> None:
    from django.conf import settings

    for module in getattr(settings, "STEPWISE_EVALUATION_SCORERS", ()):
        if module not in _imported:
            importlib.import_module(module)  # registers its scorers as it is imported
            _imported.add(module)


def _qualname(function: Callable) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
