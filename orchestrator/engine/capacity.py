"""Capacity classes: which queues a run's work goes to, and what share of each constrained
dependency (a model provider's quota, `quotas.py`) it is guaranteed (docs/operations.md#capacity).

Three are built in — `interactive` (the plain queues), `batch` (their `.batch` side, where map
items go too) and `evaluation` (their `.evaluation` side) — and an operator adds more with
STEPWISE_CAPACITY_CLASSES (JSON), e.g. `{"bulk": {"shares": {"model:fast": 0.1}}}`: the class
`bulk` has the queues `orchestrator.bulk`, `tools.bulk` and `agent.<model>.bulk`, which a
deployment gives workers of its own (`stepwise_queues bulk`). The same setting may change the
shares of a built-in class. Reads settings only: no database, no cache.
"""
from dataclasses import dataclass, field

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .states import RunCapacity

# What each built-in class is guaranteed of a dependency that names no share for it.
BUILTIN_SHARES = {RunCapacity.INTERACTIVE: 0.6, RunCapacity.BATCH: 0.2, RunCapacity.EVALUATION: 0.2}
MAX_CLASS_NAME = 16  # Run.capacity's column


@dataclass(frozen=True)
class CapacityClass:
    name: str
    # The suffix of its queues ("" for interactive: the plain queues).
    suffix: str
    # Its guaranteed fraction of each dependency (dependency name -> 0..1), and of any other.
    shares: dict = field(default_factory=dict)
    default_share: float = 0.0

    def share_of(self, dependency: str) -> float:
        return float(self.shares.get(dependency, self.default_share))


def capacity_classes() -> dict[str, CapacityClass]:
    """Every class this deployment knows, the built-in ones first. Raises ImproperlyConfigured
    for a STEPWISE_CAPACITY_CLASSES that `config_problems` finds fault with."""
    configured = getattr(settings, "STEPWISE_CAPACITY_CLASSES", None) or {}
    if problems := config_problems(configured):
        raise ImproperlyConfigured("; ".join(problems))
    classes = {}
    for name in [*RunCapacity.values, *sorted(set(configured) - set(RunCapacity.values))]:
        options = configured.get(name) or {}
        suffix = "" if name == RunCapacity.INTERACTIVE else f".{name}"
        classes[name] = CapacityClass(name, suffix, dict(options.get("shares") or {}),
                                      float(options.get("default_share",
                                                        BUILTIN_SHARES.get(name, 0.0))))
    return classes


def class_names() -> list[str]:
    return list(capacity_classes())


def added_class_names() -> list[str]:
    """The classes an operator added (each with queues of its own)."""
    return [name for name in capacity_classes() if name not in RunCapacity.values]


def capacity_problems(capacity: object, *, path: str = "capacity") -> list[dict]:
    """Why `capacity` names no class of this deployment ([] when it does)."""
    if isinstance(capacity, str) and capacity in capacity_classes():
        return []
    return [{"path": path, "message": f"one of {', '.join(class_names())}"}]


def config_problems(configured: object) -> list[str]:
    """What is wrong with a STEPWISE_CAPACITY_CLASSES value (checked at start-up)."""
    if not isinstance(configured, dict):
        return ["STEPWISE_CAPACITY_CLASSES must be a JSON object of class name -> options"]
    problems = []
    for name, options in configured.items():
        if not (isinstance(name, str) and name.isidentifier() and name.islower()
                and len(name) <= MAX_CLASS_NAME):
            problems.append(f"class {name!r}: a name is lower-case letters, digits and _, "
                            f"at most {MAX_CLASS_NAME}")
            continue
        if not isinstance(options, dict) or set(options) - {"shares", "default_share"}:
            problems.append(f"class {name!r}: options are `shares` and `default_share`")
            continue
        shares = {**(options.get("shares") or {}), "default_share": options.get("default_share", 0)}
        for dependency, share in shares.items():
            if not isinstance(share, int | float) or not 0 <= share <= 1:
                problems.append(f"class {name!r}: the share of {dependency} is a fraction 0..1")
    return problems


def queue_suffix(capacity: str) -> str:
    """The suffix of a class's queues (an unknown one — a class removed while its runs go on —
    keeps to its name, so its runs' work stays apart)."""
    known = capacity_classes().get(capacity)
    if known is not None:
        return known.suffix
    return "" if capacity == RunCapacity.INTERACTIVE else f".{capacity}"
