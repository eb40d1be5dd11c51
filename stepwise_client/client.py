"""The client: start a run, wait for it, send it a signal, approve or reject its gate, answer its
input task, cancel it, fire a trigger, and keep a workflow's evaluation datasets (create, add or
upload cases, add a run, remove).

Every call that creates something carries an idempotency key (one is generated when the caller
gives none), so the client can retry a call whose answer was lost — a timeout, a reset
connection, a 502/503/504 — without starting a second run. Errors come back as
`StepwiseError` with the API's `errors` list ({"path", "message"}).
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from .builder import definition_of

TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "timed_out",
                             "compensation_failed"})
RETRIED_STATUSES = frozenset({502, 503, 504})


def _segment(value: object) -> str:
    """One path segment: every reserved character quoted, and dots too, so that a name like
    `..` or `a/../b` stays inside its segment instead of naming another endpoint."""
    return quote(str(value), safe="").replace(".", "%2E")


def _path(*segments: object) -> str:
    return "/api/v1/" + "".join(f"{_segment(s)}/" for s in segments)


class StepwiseError(Exception):
    """The API refused a call. `status` is the HTTP status, `errors` its problems."""

    def __init__(self, status: int, errors: list[dict]):
        self.status, self.errors = status, errors
        detail = "; ".join(f"{e.get('path') or '-'}: {e.get('message')}" for e in errors)
        super().__init__(f"HTTP {status}: {detail}")


class WaitTimeout(TimeoutError):
    """`wait` gave up; `run` is the run as last seen."""

    def __init__(self, run: Run, timeout: float):
        super().__init__(f"run {run.id} is still {run.state} after {timeout} s")
        self.run = run


@dataclass(frozen=True)
class Run:
    id: str
    state: str
    workflow: str
    url: str
    trigger: str = "api"
    output: Any = None
    error: Any = None
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Run:
        return cls(id=str(data["id"]), state=data["state"], workflow=data.get("workflow", ""),
                   url=data.get("url", ""), trigger=data.get("trigger", "api"),
                   output=data.get("output"), error=data.get("error"), data=data)


@dataclass(frozen=True)
class Approval:
    id: int
    state: str
    run: str
    step: str
    instructions: str = ""
    # The hash of the exact action this request approves: deciding sends it back, so a
    # decision is bound to what was reviewed (docs/approvals.md).
    proposal_hash: str = ""
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Approval:
        return cls(id=data["id"], state=data["state"], run=str(data["run"]), step=data["step"],
                   instructions=data.get("instructions") or "",
                   proposal_hash=data.get("proposal_hash") or "", data=data)


@dataclass(frozen=True)
class InputTask:
    """A `human_input` step's question: the form (a JSON Schema) its answer must fit."""

    id: int
    state: str
    run: str
    step: str
    group: str = ""
    form: Mapping[str, Any] = field(default_factory=dict)
    allow_abstain: bool = False
    deadline_at: str = ""
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> InputTask:
        return cls(id=data["id"], state=data["state"], run=str(data["run"]), step=data["step"],
                   group=data.get("group") or "", form=data.get("form") or {},
                   allow_abstain=bool(data.get("allow_abstain")),
                   deadline_at=data.get("deadline_at") or "", data=data)


@dataclass(frozen=True)
class Firing:
    """What a fired trigger did: `status` started, duplicate, queued or ignored."""

    status: str
    run: str | None
    key: str | None

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Firing:
        return cls(status=data["status"], run=data.get("run"), key=data.get("key"))


@dataclass(frozen=True)
class Signal:
    """A signal sent to a run: `state` consumed (a wait step completed with it, `step`) or
    buffered (kept until one waits); `duplicate` when its key had been sent already."""

    name: str
    key: str
    state: str
    step: str | None
    duplicate: bool

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Signal:
        return cls(name=data["name"], key=data["key"], state=data["state"],
                   step=data.get("step"), duplicate=data.get("duplicate", False))


class Stepwise:
    """A connection to one Stepwise server, authenticated with an API token."""

    def __init__(self, base_url: str, token: str, *, timeout: float = 10.0, retries: int = 3,
                 http: httpx.Client | None = None):
        self._http = http or httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)
        self._headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self._retries = retries

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Stepwise:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- runs ----------------------------------------------------------------------------

    def start(self, workflow: str, input: Mapping[str, Any], *, idempotency_key: str | None = None,
              version: int | None = None, team: str | None = None) -> Run:
        """Start a run of `workflow` (its latest version, or `version`).

        With the same `idempotency_key` and input, the run already started is returned; with
        the same key and another input, StepwiseError 409.
        """
        body: dict[str, Any] = {"input": dict(input)}
        if version is not None:
            body["version"] = version
        params = {"team": team} if team else None
        data = self._call("POST", _path("workflows", workflow, "runs"), json=body, params=params,
                          idempotency_key=idempotency_key or str(uuid.uuid4()))
        return Run.of(data)

    def save_workflow(self, workflow: object, *, team: str | None = None) -> dict:
        """Save a definition — a `builder.Workflow`, or a dict — as the next version of its
        workflow (an unchanged one returns the latest version). Returns the version's
        number, digest and URL; StepwiseError 400 lists every problem with its path."""
        body: dict[str, Any] = {"definition": definition_of(workflow)}
        if team:
            body["team"] = team
        return self._call("POST", "/api/v1/workflows/", json=body)

    def get(self, run_id: str) -> Run:
        return Run.of(self._call("GET", _path("runs", run_id)))

    def wait(self, run_id: str, *, until: Iterable[str] = TERMINAL_STATES, timeout: float = 120,
             poll: float = 0.5) -> Run:
        """Poll the run until its state is one of `until` (default: it has ended).

        Raises WaitTimeout after `timeout` seconds. Waiting for "waiting" stops at a gate.
        """
        wanted = frozenset(until)
        deadline = time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if run.state in wanted:
                return run
            if time.monotonic() >= deadline:
                raise WaitTimeout(run, timeout)
            time.sleep(poll)

    def cancel(self, run_id: str) -> Run:
        """Cancel the run (cooperatively: running steps finish first)."""
        return Run.of(self._call("POST", _path("runs", run_id, "cancel")))

    def signal(self, run_id: str, name: str, payload: Mapping[str, Any], *,
               idempotency_key: str | None = None) -> Signal:
        """Send the signal `name` with `payload` to the run: the wait step waiting for it
        completes with `payload` as its output. Sending again with the same key changes
        nothing (a random key when none is given, so a retry of this call is still safe)."""
        return Signal.of(self._call("POST", _path("runs", run_id, "signals", name),
                                    json={"payload": dict(payload)},
                                    idempotency_key=idempotency_key or str(uuid.uuid4())))

    # --- approvals -----------------------------------------------------------------------

    def pending_approvals(self, run_id: str | None = None) -> list[Approval]:
        params = {"state": "pending", **({"run": run_id} if run_id else {})}
        data = self._call("GET", "/api/v1/approvals/", params=params)
        return [Approval.of(item) for item in data.get("results", [])]

    def approve(self, approval: Approval, *, note: str = "") -> Approval:
        """Approve the action `approval` showed (its `proposal_hash` is sent back: if the
        action changed since it was read, the server refuses with a 409)."""
        return self._decide(approval, "approve", note)

    def reject(self, approval: Approval, *, note: str) -> Approval:
        """Reject, with the reason (required)."""
        return self._decide(approval, "reject", note)

    # --- input tasks (human_input steps) -------------------------------------------------

    def input_tasks(self, run_id: str | None = None, *, mine: bool = True) -> list[InputTask]:
        """Open input tasks: those waiting for your answer (`mine`), or every open one of your
        teams' runs; of one run with `run_id`."""
        params = {"state": "open", **({"run": run_id} if run_id else {}),
                  **({"for": "me"} if mine else {})}
        data = self._call("GET", "/api/v1/input-tasks/", params=params)
        return [InputTask.of(item) for item in data.get("results", [])]

    def input_task(self, task_id: int) -> InputTask:
        return InputTask.of(self._call("GET", _path("input-tasks", task_id)))

    def answer(self, task: InputTask | int, answer: Mapping[str, Any] | None = None, *,
               abstain: bool = False, note: str = "") -> InputTask:
        """Answer an input task with the form's fields, or abstain where it allows. StepwiseError
        400 names each field the form refuses; 403 if it is not yours to answer; 409 if it is
        stale (answered already, expired, or its run no longer waits for it)."""
        task_id = task.id if isinstance(task, InputTask) else task
        body = {"answer": dict(answer) if answer is not None else None, "abstain": abstain,
                "note": note}
        return InputTask.of(self._call("POST", _path("input-tasks", task_id, "answer"), json=body))

    def _decide(self, approval: Approval, verb: str, note: str) -> Approval:
        return Approval.of(self._call("POST", _path("approvals", approval.id, verb),
                                      json={"note": note, "proposal_hash": approval.proposal_hash}))

    # --- triggers ------------------------------------------------------------------------

    def fire(self, trigger_id: str, payload: Any, *, idempotency_key: str | None = None) -> Firing:
        """Fire a programmatic trigger with `payload` (what its input template reads)."""
        return Firing.of(self._call("POST", _path("triggers", trigger_id, "fire"), json=payload,
                                    idempotency_key=idempotency_key or str(uuid.uuid4())))

    # --- evaluation datasets (docs/evaluation.md) -------------------------------------------

    def datasets(self, *, workflow: str | None = None, team: str | None = None) -> list[dict]:
        """The datasets of your teams (of one workflow, one team), each with its latest version."""
        params = {k: v for k, v in {"workflow": workflow, "team": team}.items() if v}
        return self._all("/api/v1/datasets/", params)

    def dataset(self, dataset_id: int) -> dict:
        """A dataset and every version of it, newest first."""
        return self._call("GET", _path("datasets", dataset_id))

    def create_dataset(self, workflow: str, name: str, *, description: str = "",
                       team: str | None = None) -> dict:
        body = {"workflow": workflow, "name": name, "description": description}
        return self._call("POST", "/api/v1/datasets/", json={**body, **({"team": team} if team else {})})

    def cases(self, dataset_id: int, *, version: int | None = None, risk_tier: str | None = None) -> list[dict]:
        """Every case of a version (default: the latest), by key."""
        path = (_path("datasets", dataset_id, "cases") if version is None
                else _path("datasets", dataset_id, "versions", version, "cases"))
        return self._all(path, {"risk_tier": risk_tier} if risk_tier else {})

    def add_cases(self, dataset_id: int, cases: Iterable[Mapping[str, Any]], *, mode: str = "add",
                  workflow_version: int | None = None, note: str = "") -> dict:
        """Add cases (mode "replace": a case of the same key is replaced; "replace_all": they
        become the whole dataset). Returns the new version; StepwiseError 400 lists every problem."""
        body = {"cases": [dict(c) for c in cases], "mode": mode, "workflow_version": workflow_version, "note": note}
        return self._call("POST", _path("datasets", dataset_id, "cases"), json=body)

    def upload_cases(self, dataset_id: int, data: bytes, *, format: str, mode: str = "add",
                     workflow_version: int | None = None, note: str = "") -> dict:
        """Add the cases of a JSON lines (`format="jsonl"`) or CSV (`"csv"`) file's bytes."""
        content_type = {"jsonl": "application/jsonl", "csv": "text/csv"}[format]
        params = {"mode": mode, "note": note, **({"workflow_version": workflow_version} if workflow_version else {})}
        return self._call("POST", _path("datasets", dataset_id, "upload"), params=params,
                          content=data, content_type=content_type)

    def add_run(self, dataset_id: int, run_id: str, *, risk_tier: str, tags: Iterable[str] = (),
                expected: Mapping[str, Any] | None = None, key: str | None = None, note: str = "") -> dict:
        """Add a finished run as a case; `expected` corrects what the run did."""
        body = {"run": run_id, "risk_tier": risk_tier, "tags": list(tags), "key": key, "note": note,
                "expected": None if expected is None else dict(expected)}
        return self._call("POST", _path("datasets", dataset_id, "from-run"), json=body)

    def remove_cases(self, dataset_id: int, keys: Iterable[str], *, note: str = "") -> dict:
        return self._call("POST", _path("datasets", dataset_id, "cases", "remove"),
                          json={"keys": list(keys), "note": note})

    def _all(self, path: str, params: Mapping) -> list[dict]:
        """Every item of a paginated list, following `next` page by page (its `cursor`, sent
        to this client's base URL, so a proxy's rewritten host does not matter)."""
        items, cursor = [], None
        while True:
            page = self._call("GET", path, params={**params, "limit": 500,
                                                   **({"cursor": cursor} if cursor else {})})
            items += page.get("results", [])
            if not page.get("next"):
                return items
            cursor = httpx.URL(page["next"]).params.get("cursor")
            if not cursor:
                raise StepwiseError(200, [{"path": "next", "message": "a next link without a cursor"}])

    # --- HTTP ----------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, json: Any = None, params: Mapping | None = None,
              idempotency_key: str | None = None, content: bytes | None = None,
              content_type: str = "") -> dict:
        headers = dict(self._headers)
        if content_type:
            headers["Content-Type"] = content_type
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        # A GET, or a POST that carries an idempotency key, is safe to send again.
        attempts = self._retries if method == "GET" or idempotency_key else 1
        for attempt in range(1, attempts + 1):
            try:
                response = self._http.request(method, path, json=json, params=params,
                                              headers=headers, content=content)
            except httpx.TransportError:
                if attempt == attempts:
                    raise
            else:
                if response.status_code not in RETRIED_STATUSES or attempt == attempts:
                    return self._answer(response)
            time.sleep(min(0.2 * 2 ** attempt, 2.0))
        raise AssertionError("unreachable")

    @staticmethod
    def _answer(response: httpx.Response) -> dict:
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.is_success:
            return data if isinstance(data, dict) else {}
        errors = data.get("errors") if isinstance(data, dict) else None
        if not isinstance(errors, list):
            detail = data.get("detail") if isinstance(data, dict) else None
            errors = [{"path": "", "message": str(detail or response.text[:500])}]
        raise StepwiseError(response.status_code, errors)
