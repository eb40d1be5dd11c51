"""Result reuse: a step that declares `cache` copies the output an identical earlier step
produced instead of calling its model or tool (docs/definitions.md#cache,
docs/operations.md#reusing-results).

Owns a step's result fingerprint (its rendered key joined with everything that decides the
output), the lookup a worker makes right after claiming the step, and the keeping of a
succeeded step's output. Entries (`StepResult`) belong to a team: a lookup never reads
another team's. A sandboxed run, and a run with secret inputs, neither reads nor keeps one.

It must not change a step's or a run's state: a hit is committed by the worker's
`step_succeed`, like any result, which calls `result_keep` and records `step.cache_hit`.
"""
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from orchestrator.integrations.tools.registry import get_tool
from orchestrator.models import Run, StepResult, StepRun

from ..clock import now
from ..definitions import TemplateError, render_template
from ..definitions.format import calls_model
from ..hashing import digest_of
from ..prompts import prompt_hash
from ..retry import StepError

# Bump when what goes into a fingerprint changes: every entry kept before then misses.
FINGERPRINT_VERSION = "stepwise-cache/1"
KEY_SHOWN_CHARS = 200  # StepResult.key: the start of the rendered key, for people


@dataclass(frozen=True)
class Reuse:
    """A cacheable step's lookup: its fingerprint, and the entry found (None: a miss, whose
    output is kept once the step succeeds)."""

    fingerprint: str
    key: str
    ttl_s: int
    hit: StepResult | None = None

    @property
    def source(self) -> dict:
        """Where a hit's output came from: {run, step}."""
        assert self.hit is not None
        return {"run": str(self.hit.run_id), "step": self.hit.step.name}


def reusable(spec: dict, *, sandbox: dict | None, sealed: str | None) -> bool:
    """Whether this step of this run may read or keep a reusable result: it declares `cache`,
    the run is live (a sandboxed run's answers are not the world's) and holds no secret input
    (an output computed from one must not reach another run), and its tool changes nothing."""
    if not spec.get("cache") or sandbox is not None or sealed is not None:
        return False
    if spec["type"] == "tool":
        # Refused when the definition was saved; a tool registered as side-effecting since
        # then, or a step declaring it, is still never served from the cache.
        try:
            tool = get_tool(spec["tool"])
        except KeyError:
            return False
        return not (spec.get("side_effect") or tool.side_effect or spec.get("compensate"))
    return True


def fingerprint_of(spec: dict, step_input: dict) -> tuple[str, str]:
    """(fingerprint, rendered key) of a cacheable step over its input (as stored: secret
    values are markers there, never the values). Raises StepError (validation) when the key
    cannot be rendered."""
    cache = spec["cache"]
    try:
        key = render_template(cache["key"], step_input)
    except TemplateError as exc:
        raise StepError("validation", f"cache key could not be rendered: {exc}") from exc
    parts: dict = {
        "version": FINGERPRINT_VERSION,
        "key": key,
        # The step's definition, but not how long its results are kept.
        "step": digest_of({**spec, "cache": {"key": cache["key"]}}),
        "output_schema": digest_of(spec.get("output_schema") or spec.get("proposal") or {}),
    }
    if calls_model(spec):
        config = settings.STEPWISE_MODELS.get(spec["model"], {})
        parts.update(prompt=prompt_hash(spec), model=spec["model"],
                     provider=config.get("provider", ""), model_id=config.get("model_id", ""))
    if spec["type"] == "tool":
        tool = get_tool(spec["tool"])
        parts.update(tool=tool.name, tool_version=tool.version,
                     tool_output_schema=digest_of(tool.output_schema or {}))
    return digest_of(parts), key


def result_lookup(spec: dict, step_input: dict, *, team: str, sandbox: dict | None,
                  sealed: str | None) -> Reuse | None:
    """The lookup of a claimed step in its team's (slug `team`) reusable results: None when
    the step may not be reused (`reusable`), else a `Reuse` with the unexpired entry found, or
    none. A read, outside any transaction. Raises StepError when the key cannot be rendered."""
    if not reusable(spec, sandbox=sandbox, sealed=sealed):
        return None
    fingerprint, key = fingerprint_of(spec, step_input)
    hit = (StepResult.objects.filter(team__slug=team, fingerprint=fingerprint,
                                     expires_at__gt=now())
           .select_related("step").only("output", "run_id", "step__name", "step__state").first())
    return Reuse(fingerprint, key, spec["cache"]["ttl_s"], hit)


def result_keep(*, run: Run, step: StepRun, reuse: Reuse, output: object) -> None:
    """Keep `step`'s output (it just succeeded, computed: a miss) for reuse by its team's runs
    for the step's ttl_s, in place of an entry of the same fingerprint. In the success's
    transaction, the run locked; another run keeping the same fingerprint at once wins or
    loses the row, never fails this one's success."""
    at = now()
    values = {"key": reuse.key[:KEY_SHOWN_CHARS], "output": output, "run": run, "step": step,
              "created_at": at, "expires_at": at + timedelta(seconds=reuse.ttl_s)}
    try:
        with transaction.atomic():  # a savepoint: a lost race on the row is not this step's
            StepResult.objects.update_or_create(team_id=run.team_id,
                                                fingerprint=reuse.fingerprint, defaults=values)
    except IntegrityError:
        pass  # another run kept the same output under this fingerprint: either one serves
