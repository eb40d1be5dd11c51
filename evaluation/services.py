"""The changes to evaluation datasets, one service each: create a dataset, add (or replace)
cases, add a parsed upload, add a finished run as a case, remove cases.

Every change to the cases writes a new `DatasetVersion` holding the whole set after the change,
with its case count, counts per risk tier and digest, and one ledger entry (actor, dataset,
version, counts, digest), in one transaction under a lock on the dataset row, so two changes
racing cannot both become the same version. A change is checked whole before anything is
written: every problem is reported at its path (`cases[2].input.order_id`, or `line 7.expected`
for an upload) and nothing is kept.

Each service checks the actor itself (docs/permissions.md): `dataset.edit` (editors, owners)
creates datasets and changes their cases; `dataset.add_run` (editors, operators, owners) adds a
finished run. Who may see a dataset at all is `selectors.datasets_visible_to`.
"""
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from django.db import IntegrityError, transaction

from audit.services import audit_record
from orchestrator.engine.authz import Action, Actor, label, person, require
from orchestrator.engine.definitions.limits import document_problems, run_input_problems
from orchestrator.engine.definitions.problems import format_path
from orchestrator.engine.errors import InputInvalid, NotAllowed
from orchestrator.engine.hashing import digest_of
from orchestrator.engine.services.runs import input_problems
from orchestrator.engine.states import RUN_TERMINAL
from orchestrator.integrations.tools.registry import get_tool
from orchestrator.models import Run, RunSecret, Workflow, WorkflowVersion

from .expected import expected_problems
from .limits import (
    MAX_CASES_PER_CHANGE,
    MAX_CASES_PER_VERSION,
    MAX_EXPECTED_BYTES,
    MAX_EXPECTED_DEPTH,
    MAX_KEY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
)
from .models import Case, Dataset, DatasetVersion, RiskTier
from .selectors import expected_from_run
from .uploads import line_path, parse_cases

KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]*$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
MODES = ("add", "replace", "replace_all")
CASE_FIELDS = frozenset({"key", "input", "expected", "risk_tier", "tags", "responses"})


def dataset_create(*, workflow: Workflow, name: str, actor: Actor, description: str = "") -> Dataset:
    """A new, empty dataset of `workflow` (its version 1 holds no case). Audited.

    Raises Forbidden without dataset.edit in the workflow's team, InputInvalid for a name that
    is not a slug or that the workflow's datasets already use."""
    require(actor, Action.DATASET_EDIT, team=workflow.team)
    problems = []
    if not (isinstance(name, str) and 0 < len(name) <= 100 and NAME.match(name)):
        problems.append({"path": "name", "message": "a name is 1 to 100 lowercase letters, digits, - and _, "
                         "starting with a letter or digit"})
    if len(description) > 2000:
        problems.append({"path": "description", "message": "at most 2,000 characters"})
    if problems:
        raise InputInvalid("the dataset is invalid", problems)
    try:
        with transaction.atomic():
            dataset = Dataset(team=workflow.team, workflow=workflow, name=name, description=description,
                              created_by=person(actor))
            dataset.save()
            version = _write_version(dataset, [], actor=actor, change="created", note="",
                                     workflow_version=workflow.active_version)
            _audit(dataset, version, actor, "dataset.created", {})
    except IntegrityError:
        raise InputInvalid("the dataset exists", [{"path": "name", "message":
                           f"workflow '{workflow.name}' already has a dataset '{name}'"}]) from None
    return dataset


def dataset_cases_add(*, dataset: Dataset, cases: list, actor: Actor, mode: str = "add",
                      workflow_version: int | None = None, note: str = "",
                      source_run: Run | None = None) -> DatasetVersion:
    """Write the next version of `dataset` with `cases` added: each a case object
    (`{"key", "input", "expected", "risk_tier", "tags"}`, docs/evaluation.md), its input checked
    against the input schema of the workflow's version `workflow_version` (else the published
    one) and its expected outcome against that version's steps.

    `mode`: "add" refuses a key the dataset has; "replace" replaces the case of that key;
    "replace_all" makes `cases` the whole dataset. Audited.

    Raises Forbidden without dataset.edit, InputInvalid listing every problem (paths
    `cases[i]...`, or `line N...` for a case read from a file)."""
    require(actor, Action.DATASET_EDIT, team=dataset.team)
    return _add(dataset=dataset, cases=cases, actor=actor, mode=mode, workflow_version=workflow_version,
                note=note, source_run=source_run)


def dataset_cases_upload(*, dataset: Dataset, data: bytes, fmt: str, actor: Actor, mode: str = "add",
                         workflow_version: int | None = None, note: str = "") -> DatasetVersion:
    """`dataset_cases_add` with the cases of a file (`fmt`: "jsonl" or "csv", `uploads`); a
    problem's path names the line it is on. All or nothing."""
    require(actor, Action.DATASET_EDIT, team=dataset.team)
    located = parse_cases(data, fmt)
    return _add(dataset=dataset, cases=[case for _, case in located], actor=actor, mode=mode,
                workflow_version=workflow_version, note=note, where=[line_path(line) for line, _ in located])


def dataset_case_from_run(*, dataset: Dataset, run: Run, actor: Actor, risk_tier: str,
                          tags: Iterable[str] = (), expected: dict | None = None, key: str | None = None,
                          note: str = "") -> DatasetVersion:
    """Write the next version of `dataset` with a case made from a finished `run` of its
    workflow: the run's input, and as expected outcome `expected` — the operator's correction —
    or else what the run did (`selectors.expected_from_run`), checked against the run's
    version. The case is keyed `key` (default `run-<id>`) and remembers the run. Audited.

    Raises Forbidden without dataset.add_run, NotAllowed for a run that has not finished, is of
    another workflow or holds secret input (sealed, so no case can carry it), InputInvalid for
    a case that does not check."""
    require(actor, Action.DATASET_ADD_RUN, team=dataset.team)
    if run.version.workflow_id != dataset.workflow_id:
        raise NotAllowed("the run is of another workflow", [{"path": "run", "message":
                         f"the run is of workflow '{run.version.workflow.name}', not '{dataset.workflow.name}'"}])
    if run.state not in RUN_TERMINAL:
        raise NotAllowed("the run has not finished", [{"path": "run", "message":
                         f"the run is {run.state}; only a finished run becomes a case"}])
    if RunSecret.objects.filter(run=run).exists():
        raise NotAllowed("the run holds secret input", [{"path": "run", "message":
                         "the run's input holds secret values, which are sealed: it cannot become a case"}])
    case = {"key": key or f"run-{run.id}", "input": run.input, "risk_tier": risk_tier, "tags": list(tags),
            "expected": expected_from_run(run) if expected is None else expected}
    return _add(dataset=dataset, cases=[case], actor=actor, mode="add", workflow_version=run.version.number,
                note=note or f"from run {run.id}", source_run=run, change="from_run")


def dataset_sample_load(*, workflow: Workflow, path: Path, actor: Actor, name: str = "sample") -> Dataset | None:
    """Create `workflow`'s dataset `name` from the JSON lines file at `path` (an example's
    sample, examples/datasets/), once: None when the workflow has it already. Two changes,
    each audited: the dataset, then its cases as version 2.

    Raises Forbidden without dataset.edit, InputInvalid for a file that does not fit the workflow."""
    if Dataset.objects.filter(workflow=workflow, name=name).exists():
        return None
    dataset = dataset_create(workflow=workflow, name=name, actor=actor,
                             description=f"Sample cases of the {workflow.name} example ({path.name}).")
    dataset_cases_upload(dataset=dataset, data=path.read_bytes(), fmt="jsonl", actor=actor,
                         note=f"loaded from {path.name}")
    return dataset


def dataset_cases_remove(*, dataset: Dataset, keys: list, actor: Actor, note: str = "") -> DatasetVersion:
    """Write the next version of `dataset` without the cases keyed `keys`. Audited.

    Raises Forbidden without dataset.edit, InputInvalid for no key, too many, or a key the
    dataset does not have (paths `keys[i]`)."""
    require(actor, Action.DATASET_EDIT, team=dataset.team)
    problems = []
    if not isinstance(keys, list) or not keys:
        problems.append({"path": "keys", "message": "name at least one case key"})
    elif len(keys) > MAX_CASES_PER_CHANGE:
        problems.append({"path": "keys", "message": f"at most {MAX_CASES_PER_CHANGE:,} cases are removed at once"})
    if problems:
        raise InputInvalid("nothing to remove", problems)
    with transaction.atomic():
        dataset, latest = _lock(dataset)
        present = set(latest.cases.values_list("key", flat=True))
        missing = [{"path": f"keys[{i}]", "message": f"the dataset has no case '{k}'"}
                   for i, k in enumerate(keys) if k not in present]
        if missing:
            raise InputInvalid("unknown case keys", missing)
        kept = _cases_of(latest, exclude=set(keys))
        version = _write_version(dataset, kept, actor=actor, change="removed", note=note,
                                 workflow_version=latest.workflow_version)
        _audit(dataset, version, actor, "dataset.cases_removed", {"removed": len(set(keys))})
    return version


# --- the one path every added case takes ---------------------------------------------------------


def _add(*, dataset: Dataset, cases: list, actor: Actor, mode: str, workflow_version: int | None,
         note: str, source_run: Run | None = None, change: str = "",
         where: list[str] | None = None) -> DatasetVersion:
    """`where`: each case's path in what was sent (default `cases[i]`; `line N` for a file)."""
    if mode not in MODES:
        raise InputInvalid("unknown mode", [{"path": "mode", "message": f"mode is one of {', '.join(MODES)}"}])
    if len(note) > 500:
        raise InputInvalid("the note is too long", [{"path": "note", "message": "at most 500 characters"}])
    version = _workflow_version(dataset.workflow, workflow_version)
    if not isinstance(cases, list) or not cases:
        raise InputInvalid("no case", [{"path": "cases", "message": "give at least one case"}])
    if len(cases) > MAX_CASES_PER_CHANGE:
        raise InputInvalid("too many cases", [{"path": "cases", "message":
                           f"{len(cases):,} cases; at most {MAX_CASES_PER_CHANGE:,} are added at once"}])
    rows, problems, seen = [], [], {}
    for index, raw in enumerate(cases):
        at = where[index] if where else f"cases[{index}]"
        row, found = _case(raw, at, version.normalized)
        problems += found
        if row is not None:
            if row.key in seen:
                problems.append({"path": f"{at}.key", "message": f"the key '{row.key}' is also at {seen[row.key]}"})
            seen.setdefault(row.key, at)
            row.source_run = source_run
            rows.append(row)
    if problems:
        raise InputInvalid("the cases are invalid", problems)
    with transaction.atomic():
        dataset, latest = _lock(dataset)
        if mode == "replace_all":
            kept, replaced = [], latest.case_count
        else:
            present = set(latest.cases.values_list("key", flat=True))
            clash = [row.key for row in rows if row.key in present]
            if clash and mode == "add":
                raise InputInvalid("the keys exist", [
                    {"path": f"{seen[key]}.key", "message": f"the dataset has a case '{key}' "
                     "(add it with mode replace to replace that case)"} for key in clash])
            kept, replaced = _cases_of(latest, exclude=set(clash)), len(clash)
        new = _write_version(dataset, kept + rows, actor=actor, change=change or _change(mode, replaced),
                             note=note, workflow_version=version)
        _audit(dataset, new, actor, "dataset.cases_added", {
            "added": len(rows) - (replaced if mode == "replace" else 0),
            "replaced": replaced if mode == "replace" else 0,
            "dropped": replaced if mode == "replace_all" else 0, "mode": mode,
            **({"source_run": str(source_run.id)} if source_run else {})})
    return new


def _change(mode: str, replaced: int) -> str:
    return {"add": "added", "replace": "replaced" if replaced else "added", "replace_all": "replaced"}[mode]


def _workflow_version(workflow: Workflow, number: int | None) -> WorkflowVersion:
    if number is not None:
        found = workflow.versions.filter(number=number).first() if isinstance(number, int) else None
        if found is None:
            raise InputInvalid("no such version", [{"path": "workflow_version", "message":
                               f"workflow '{workflow.name}' has no version {number}"}])
        return found
    if workflow.active_version is None:
        raise InputInvalid("no published version", [{"path": "workflow_version", "message":
                           f"workflow '{workflow.name}' has no published version; name the version to check against"}])
    return workflow.active_version


def _case(raw: object, where: str, definition: dict) -> tuple[Case | None, list[dict]]:
    """The case `raw` describes, not saved, and every problem with it (paths under `where`)."""
    if not isinstance(raw, dict):
        return None, [{"path": where, "message": "a case is a JSON object"}]
    problems = [{"path": f"{where}.{name}", "message": "unknown field (a case has key, input, expected, "
                 "risk_tier, tags, responses)"} for name in raw if name not in CASE_FIELDS]
    for name in ("key", "input", "expected", "risk_tier"):
        if name not in raw:
            problems.append({"path": f"{where}.{name}", "message": f"'{name}' is required"})
    key, tier, tags = raw.get("key"), raw.get("risk_tier"), raw.get("tags", [])
    if "key" in raw and not (isinstance(key, str) and len(key) <= MAX_KEY_CHARS and KEY.match(key)):
        problems.append({"path": f"{where}.key", "message": f"a key is 1 to {MAX_KEY_CHARS} letters, digits "
                         "and . _ : @ / + -, starting with a letter or digit"})
    if "risk_tier" in raw and tier not in RiskTier.values:
        problems.append({"path": f"{where}.risk_tier", "message": f"the risk tier is one of {', '.join(RiskTier.values)}"})
    if not (isinstance(tags, list) and len(tags) <= MAX_TAGS and len(set(map(str, tags))) == len(tags)
            and all(isinstance(t, str) and 0 < len(t) <= MAX_TAG_CHARS for t in tags)):
        problems.append({"path": f"{where}.tags", "message": f"tags are at most {MAX_TAGS} different texts of "
                         f"1 to {MAX_TAG_CHARS} characters"})
    if "input" in raw:
        found = run_input_problems(raw["input"]) or input_problems(definition["input_schema"], raw["input"])
        problems += [{**p, "path": f"{where}.{p['path']}"} for p in found]
    if "expected" in raw:
        problems += expected_problems(raw["expected"], definition, at=(f"{where}.expected",))
    responses = raw.get("responses", {})
    problems += responses_problems(responses, definition, at=f"{where}.responses")
    if problems:
        return None, problems
    return Case(key=key, input=raw["input"], expected=raw["expected"], risk_tier=tier, tags=list(tags),
                responses=responses,
                digest=case_digest(key, raw["input"], raw["expected"], tier, tags, responses)), []


def responses_problems(responses: object, definition: dict, *, at: str) -> list[dict]:
    """Every way `responses` is not a map from the steps of `definition` that an evaluation
    answers (side-effecting tool steps, human_input steps) to what each answers."""
    if not isinstance(responses, dict):
        return [{"path": at, "message": "responses are a JSON object: step name -> that step's output"}]
    answered = answered_steps(definition)
    problems = [{"path": f"{at}.{name}", "message": "not a side-effecting tool step or human_input step of the "
                 f"workflow (those are: {', '.join(sorted(answered)) or 'none'})"}
                for name in responses if name not in answered]
    return problems + [{"path": format_path((at, *parts)), "message": message} for parts, message in
                       document_problems(responses, max_bytes=MAX_EXPECTED_BYTES, max_depth=MAX_EXPECTED_DEPTH,
                                         what="the responses")]


def answered_steps(definition: dict) -> set[str]:
    """The steps of `definition` (normalized) an evaluation answers instead of running: the
    side-effecting tool steps and the human_input steps."""
    return {spec["name"] for spec in definition.get("steps", [])
            if (spec.get("type") == "tool" and (spec.get("side_effect") or _tool_has_effects(spec)))
            or spec.get("type") == "human_input"}


def _tool_has_effects(spec: dict) -> bool:
    try:
        return get_tool(spec.get("tool", "")).side_effect
    except KeyError:
        return False


def case_digest(key: str, input: object, expected: object, risk_tier: str, tags: list,
                responses: dict | None = None) -> str:
    fields = {"key": key, "input": input, "expected": expected, "risk_tier": risk_tier, "tags": sorted(tags)}
    return digest_of({**fields, "responses": responses} if responses else fields)


def _lock(dataset: Dataset) -> tuple[Dataset, DatasetVersion]:
    """The dataset row locked for this transaction (SQLite: the write transaction serializes),
    and its latest version as it is now."""
    dataset = Dataset.objects.select_for_update(of=("self",)).select_related("team", "workflow").get(pk=dataset.pk)
    return dataset, dataset.versions.order_by("-number").first()


def _cases_of(version: DatasetVersion, *, exclude: set[str]) -> list[Case]:
    """Unsaved copies of `version`'s cases, but those keyed in `exclude`."""
    return [Case(key=c.key, input=c.input, expected=c.expected, risk_tier=c.risk_tier, tags=c.tags,
                 responses=c.responses, source_run_id=c.source_run_id, digest=c.digest)
            for c in version.cases.exclude(key__in=exclude).order_by("key")]


def _write_version(dataset: Dataset, cases: list[Case], *, actor: Actor, change: str, note: str,
                   workflow_version: WorkflowVersion | None) -> DatasetVersion:
    if len(cases) > MAX_CASES_PER_VERSION:
        raise InputInvalid("too many cases", [{"path": "cases", "message":
                           f"a dataset holds at most {MAX_CASES_PER_VERSION:,} cases; this change makes {len(cases):,}"}])
    latest = dataset.versions.order_by("-number").values_list("number", flat=True).first() or 0
    cases = sorted(cases, key=lambda c: c.key)
    counts = Counter(c.risk_tier for c in cases)
    version = DatasetVersion(
        dataset=dataset, number=latest + 1, created_by=person(actor), note=note, change=change,
        workflow_version=workflow_version, case_count=len(cases),
        tier_counts={tier: counts.get(tier, 0) for tier in RiskTier.values},
        digest=digest_of([[c.key, c.digest] for c in cases]))
    version.save()
    for case in cases:
        case.version = version
    Case.objects.bulk_create(cases, batch_size=500)
    return version


def _audit(dataset: Dataset, version: DatasetVersion, actor: Actor, action: str, counts: dict) -> None:
    audit_record(action=action, actor=label(actor), subject_type="dataset", subject_id=dataset.id,
                 outcome=version.change, team=dataset.team.slug, workflow=dataset.workflow.name,
                 workflow_version=version.workflow_version.number if version.workflow_version else None,
                 payload={"dataset": dataset.name, "version": version.number, **counts,
                          "case_count": version.case_count, "tier_counts": version.tier_counts,
                          "digest": version.digest})
