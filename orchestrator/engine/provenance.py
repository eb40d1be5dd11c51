"""Who set a run in motion: the provenance every run records at its start (`Run.provenance`).

A run's provenance is a plain JSON value written once by `run_start`, the point every start
path passes through:

    {"path": "api" | "builder" | "schedule" | "webhook" | "queue" | "api_trigger"
             | "sub_workflow" | "fork" | ...,
     "people": [{"user": <id>, "username": "alice", "as": "started it"}, ...],
     "trigger": {"id", "name", "kind", "revision"},        # when a trigger started it
     "parent_run": "<uuid>",                                 # a child run
     "forked_from": "<uuid>", "fork_step": "<step>"}         # a fork (services/forks.py)

`people` are everyone who set the run in motion: the person who started it through the API or
the builder, the person who fired an API trigger, and for every trigger the people who created
it and last changed it (its settings or its webhook secret decide what starts and when). A child
run carries its parent's people. Separation of duties (`approvals.authority`) refuses all of
them as approvers.

Builds and reads values only; no query, no write.
"""
from .authz import Actor, is_person

STARTED = "started it"
FIRED = "fired the trigger"
TRIGGER_CREATED = "created the trigger"
TRIGGER_CHANGED = "last changed the trigger"


def person_entry(user, role: str) -> dict:
    return {"user": user.pk, "username": user.get_username(), "as": role}


def merged(people: list[dict]) -> list[dict]:
    """`people` with each person once, their roles joined in order ("created the trigger,
    fired the trigger")."""
    by_user: dict[int, dict] = {}
    for entry in people:
        found = by_user.get(entry["user"])
        if found is None:
            by_user[entry["user"]] = dict(entry)
        elif entry["as"] not in found["as"].split(", "):
            found["as"] = f"{found['as']}, {entry['as']}"
    return list(by_user.values())


def of_start(actor: Actor, *, path: str) -> dict:
    """A run started directly by `actor` (the API, the builder, a management command)."""
    people = [person_entry(actor, STARTED)] if is_person(actor) else []
    return {"path": path, "people": people}


def of_child(parent_provenance: dict, *, parent_run_id, created_by=None) -> dict:
    """A child run: its parent's people (and the parent's starter, for a parent recorded
    before provenance existed)."""
    people = list(parent_provenance.get("people") or [])
    if created_by is not None:
        people.append(person_entry(created_by, STARTED))
    return {"path": "sub_workflow", "people": merged(people), "parent_run": str(parent_run_id),
            "parent_path": parent_provenance.get("path", "")}


def people_ids(provenance: dict | None) -> set[int]:
    return {entry["user"] for entry in (provenance or {}).get("people") or []}


def describe(provenance: dict | None) -> str:
    """One line for a person to read: "webhook 'support-inbox' (revision 2), set up by alice
    (created the trigger)"."""
    if not provenance:
        return ""
    people = ", ".join(f"{p['username']} ({p['as']})" for p in provenance.get("people") or [])
    trigger = provenance.get("trigger")
    path = provenance.get("path", "")
    if trigger:
        what = f"{trigger['kind']} trigger '{trigger['name']}' (revision {trigger['revision']})"
    elif path == "sub_workflow":
        what = f"a step of run {provenance.get('parent_run', '')}"
    elif path == "fork":
        what = (f"a fork of run {provenance.get('forked_from', '')} from step "
                f"'{provenance.get('fork_step', '')}'")
    else:
        what = {"api": "the API", "builder": "the builder"}.get(path, path)
    return f"{what}; set in motion by {people}" if people else f"{what}; no person"
