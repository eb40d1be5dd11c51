"""Creating and changing triggers: validation, the beat schedule, the webhook secret, audit.

Every change needs `trigger.manage` in the trigger's team, is validated whole (every problem
with its path, `TriggerInvalid`), and writes an audit entry in its transaction. A schedule's
`PeriodicTask` (django-celery-beat) is written in the same transaction, so beat's database
scheduler picks the change up without a restart. A webhook's secret is generated here, sealed
(`triggers.sealing`) and returned once to the caller; it is never stored in the clear, put in
the ledger, or logged.
"""
from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from orchestrator.engine.authz import Action, Actor, label, person, require
from orchestrator.engine.capacity import capacity_problems
from orchestrator.engine.clock import now
from orchestrator.engine.definitions.limits import run_input_problems
from orchestrator.engine.definitions.problems import format_path
from orchestrator.engine.errors import ServiceError
from orchestrator.engine.services.runs import input_problems
from orchestrator.engine.text import text_problem
from orchestrator.models import Team, Workflow

from .. import sealing, signatures
from ..mapping import (
    MappingFailed,
    filter_problems,
    input_from_event,
    template_problems,
    template_shape_problems,
)
from ..models import MissedSlots, Trigger, TriggerKind, Uncorrelated, WhenLimited
from ..selectors import version_to_run
from ..slots import MAX_CATCH_UP, Schedule, cron_fields, schedule_problems, slot_text
from .firing import trigger_audit, trigger_lock

SCHEDULE_TASK = "triggers.tasks.schedule_fire"
ROTATION_GRACE = timedelta(hours=24)  # the replaced webhook secret still verifies this long
MAX_PER_MINUTE = 10_000
MAX_REPLAY_WINDOW_S = 3600
# What a caller may set; everything else (kind, team, secrets, slots) the services own.
EDITABLE = ("name", "description", "workflow", "workflow_version", "enabled", "input_template",
            "filter", "max_per_minute", "when_limited", "max_queued", "cron", "timezone",
            "interval_s", "missed_slots", "catch_up_max", "replay_window_s", "max_body_bytes",
            "source", "exchange", "binding_key", "queue", "stream", "correlate", "uncorrelated",
            "debounce_s", "debounce_key", "debounce_max_s", "capacity")
SCHEDULE_FIELDS = ("cron", "timezone", "interval_s")
DEBOUNCE_FIELDS = {"debounce_s", "debounce_key", "debounce_max_s"}
KIND_FIELDS = {
    TriggerKind.SCHEDULE: {"cron", "timezone", "interval_s", "missed_slots", "catch_up_max"},
    TriggerKind.WEBHOOK: {"replay_window_s", "max_body_bytes", "correlate", "uncorrelated",
                          *DEBOUNCE_FIELDS},
    TriggerKind.QUEUE: {"source", "exchange", "binding_key", "queue", "stream", "max_body_bytes",
                        "correlate", "uncorrelated", *DEBOUNCE_FIELDS},
    TriggerKind.API: {"correlate", "uncorrelated", *DEBOUNCE_FIELDS},
}
MAX_DEBOUNCE_S = 86_400


class TriggerInvalid(ServiceError):
    """The trigger's settings are not valid; `problems` lists every one. Nothing changed."""


def trigger_problems(trigger: Trigger, *, check_input: bool = True) -> list[dict]:
    """Every problem with a trigger's settings (not yet saved), each with its path.

    `check_input`: also what it would give its workflow (`trigger_input_problems`), when the
    template is valid."""
    problems = []
    if trigger.kind not in TriggerKind.values:
        return [{"path": "kind", "message": f"must be one of {', '.join(TriggerKind.values)}"}]
    if not trigger.name:
        problems.append({"path": "name", "message": "is required"})
    if trigger.workflow_version and not trigger.workflow.versions.filter(
            number=trigger.workflow_version).exists():
        problems.append({"path": "workflow_version", "message": f"workflow "
                         f"'{trigger.workflow.name}' has no version {trigger.workflow_version}"})
    if not 1 <= trigger.max_per_minute <= MAX_PER_MINUTE:
        problems.append({"path": "max_per_minute", "message": f"must be 1 to {MAX_PER_MINUTE:,}"})
    if trigger.when_limited not in WhenLimited.values:
        problems.append({"path": "when_limited", "message": "must be refuse or queue"})
    if trigger.max_queued > 100_000:
        problems.append({"path": "max_queued", "message": "must be at most 100,000"})
    unreadable = text_problem(trigger.input_template)  # an admin form's JSON, or the API's
    if unreadable is not None:
        problems.append({"path": format_path(("input_template", *unreadable[0])),
                         "message": unreadable[1]})
    problems += template_problems(trigger.input_template)
    problems += filter_problems(trigger.filter or "")
    problems += filter_problems(trigger.correlate or "", path="correlate")
    if trigger.uncorrelated not in Uncorrelated.values:
        problems.append({"path": "uncorrelated", "message": "must be refuse or start"})
    problems += _debounce_problems(trigger)
    if trigger.capacity:
        problems += capacity_problems(trigger.capacity)
    if trigger.kind == TriggerKind.SCHEDULE:
        problems += schedule_problems(Schedule(trigger.cron or "", trigger.timezone,
                                               trigger.interval_s))
        if trigger.missed_slots not in MissedSlots.values:
            problems.append({"path": "missed_slots", "message": "must be skip or catch_up"})
        if trigger.catch_up_max > MAX_CATCH_UP:
            problems.append({"path": "catch_up_max", "message": f"must be at most {MAX_CATCH_UP}"})
    if trigger.kind in (TriggerKind.WEBHOOK, TriggerKind.QUEUE):
        if not 1024 <= trigger.max_body_bytes <= settings.STEPWISE_MAX_REQUEST_BYTES:
            problems.append({"path": "max_body_bytes", "message": "must be 1,024 to "
                             f"{settings.STEPWISE_MAX_REQUEST_BYTES:,} (STEPWISE_MAX_REQUEST_BYTES)"})
    if trigger.kind == TriggerKind.WEBHOOK and not 10 <= trigger.replay_window_s <= MAX_REPLAY_WINDOW_S:
        problems.append({"path": "replay_window_s", "message": f"must be 10 to {MAX_REPLAY_WINDOW_S}"})
    if trigger.kind == TriggerKind.QUEUE:
        problems += _queue_problems(trigger)
    if check_input and trigger.enabled and not any(
            p["path"].startswith(("input_template", "workflow")) for p in problems):
        problems += trigger_input_problems(trigger)
    return problems


def _debounce_problems(trigger: Trigger) -> list[dict]:
    problems = filter_problems(trigger.debounce_key or "", path="debounce_key")
    window, bound = trigger.debounce_s, trigger.debounce_max_s
    if window is None:
        problems += [{"path": name, "message": "needs debounce_s"} for name in ("debounce_key", "debounce_max_s")
                     if getattr(trigger, name) not in (None, "")]
        return problems
    if not 1 <= window <= MAX_DEBOUNCE_S:
        problems.append({"path": "debounce_s", "message": f"must be 1 to {MAX_DEBOUNCE_S:,} seconds"})
    elif bound is not None and not window <= bound <= MAX_DEBOUNCE_S:
        problems.append({"path": "debounce_max_s", "message": f"must be debounce_s ({window}) to "
                         f"{MAX_DEBOUNCE_S:,} seconds"})
    if (trigger.correlate or "").strip():
        problems.append({"path": "debounce_s", "message": "a correlated trigger delivers each event "
                         "to its waiting run; it does not hold events back"})
    return problems


# What decides what a trigger gives its workflow: a change to one of these is checked against
# the workflow's input schema again (a disabled trigger may be changed otherwise, broken or not).
INPUT_FIELDS = frozenset({"workflow", "workflow_version", "input_template", "enabled"})


def trigger_input_problems(trigger: Trigger) -> list[dict]:
    """What the trigger would give its workflow, checked against the workflow's input schema:
    each problem with its path in the input template.

    A schedule's whole input is known: its template is rendered for a sample slot and the
    result validated. A webhook's, a queue event's or a program's input depends on a payload
    only its sender knows: what its template is sure to get wrong whatever the payload is
    refused (`mapping.template_shape_problems`).
    """
    version = version_to_run(trigger) if trigger.workflow_id else None
    if version is None:
        return []
    schema = version.normalized["input_schema"]
    if trigger.kind != TriggerKind.SCHEDULE:
        return _as_template_paths(trigger, template_shape_problems(trigger.input_template, schema))
    if schedule_problems(Schedule(trigger.cron or "", trigger.timezone, trigger.interval_s)):
        return []  # reported as the schedule's own problems
    if trigger.input_template is None:
        return [{"path": "input_template", "message": "is required for a schedule: a slot has "
                 f"no payload, and workflow '{trigger.workflow.name}' needs an input object "
                 "(the template reads {{ slot }}, {{ slot_utc }} and {{ trigger.name }})"}]
    slot = now()
    context = {"slot": slot_text(slot, trigger.timezone), "slot_utc": slot.isoformat(),
               "trigger": {"name": trigger.name, "kind": trigger.kind}}
    try:
        run_input = input_from_event(trigger.input_template, context)
    except MappingFailed as failed:
        return failed.problems
    return _as_template_paths(trigger, run_input_problems(run_input)
                              or input_problems(schema, run_input))


def _as_template_paths(trigger: Trigger, problems: list[dict]) -> list[dict]:
    """Problems of the input ("input.x") as problems of the template that builds it."""
    return [{"path": "input_template" + problem["path"].removeprefix("input"),
             "message": f"gives {problem['message']} (the input schema of workflow "
                        f"'{trigger.workflow.name}')"} for problem in problems]


def _queue_problems(trigger: Trigger) -> list[dict]:
    url = settings.STEPWISE_EVENT_SOURCES.get(trigger.source or "")
    if url is None:
        known = ", ".join(sorted(settings.STEPWISE_EVENT_SOURCES)) or "none are configured"
        return [{"path": "source", "message": f"must name a broker of STEPWISE_EVENT_SOURCES ({known})"}]
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        problems = [{"path": name, "message": "is required for a RabbitMQ source"}
                    for name in ("exchange", "binding_key") if not getattr(trigger, name)]
        if trigger.stream:
            problems.append({"path": "stream", "message": "is for Redis sources; "
                                                          "RabbitMQ uses exchange and binding_key"})
        return problems
    if url.startswith(("redis://", "rediss://")):
        problems = [] if trigger.stream else [{"path": "stream",
                                               "message": "is required for a Redis source"}]
        problems += [{"path": name, "message": "is for RabbitMQ sources; Redis uses stream"}
                     for name in ("exchange", "binding_key", "queue") if getattr(trigger, name)]
        return problems
    return [{"path": "source", "message": "STEPWISE_EVENT_SOURCES must give an amqp:// or "
                                          "redis:// URL for it"}]


TEXT_FIELDS = ("description", "filter", "correlate", "cron", "source", "exchange", "binding_key", "queue",
               "stream")


def _normalized(values: dict) -> dict:
    """`values` with null text settings read as empty (a JSON client clearing `cron` sends null)."""
    return {name: "" if value is None and name in TEXT_FIELDS else value
            for name, value in values.items()}


def _resolve_workflow(team: Team, values: dict) -> None:
    """Turn a workflow name in `values` into the team's Workflow. Raises TriggerInvalid."""
    name = values.get("workflow")
    if isinstance(name, Workflow) or name is None:
        return
    workflow = Workflow.objects.filter(team=team, name=name).first()
    if workflow is None:
        raise TriggerInvalid("no such workflow", [{"path": "workflow", "message":
                             f"team '{team.slug}' has no workflow '{name}'"}])
    values["workflow"] = workflow


def _unknown(values: dict, kind: str) -> None:
    """Refuse fields nobody may set, and settings of another kind of trigger."""
    problems = [{"path": name, "message": "cannot be set"}
                for name in sorted(set(values) - set(EDITABLE))]
    foreign = set().union(*KIND_FIELDS.values()) - KIND_FIELDS.get(kind, set())
    problems += [{"path": name, "message": f"is not a setting of a {kind} trigger"}
                 for name in sorted(foreign & set(values)) if values[name] not in (None, "")]
    if problems:
        raise TriggerInvalid("unknown fields", problems)


def _settings_of(trigger: Trigger) -> dict:
    """What the ledger records of a trigger's settings (never its secret)."""
    shown = {name: getattr(trigger, name) for name in EDITABLE if name != "workflow"}
    return {**shown, "workflow": trigger.workflow.name}


def trigger_create(*, team: Team, kind: str, actor: Actor, **values) -> tuple[Trigger, str | None]:
    """Create a trigger; return it and, for a webhook, its secret (the only time it is shown).

    `values` are fields of EDITABLE (`workflow` a name of the team's or a Workflow). Raises
    Forbidden without trigger.manage in `team`, TriggerInvalid listing every problem.
    """
    require(actor, Action.TRIGGER_MANAGE, team=team)
    _unknown(values, kind)
    values = _normalized(values)
    _resolve_workflow(team, values)
    if "workflow" not in values:
        raise TriggerInvalid("workflow is required", [{"path": "workflow", "message": "is required"}])
    trigger = Trigger(team=team, kind=kind, created_by=person(actor), **values)
    problems = trigger_problems(trigger)
    if Trigger.objects.filter(team=team, name=trigger.name).exists():
        problems.append({"path": "name", "message": f"team '{team.slug}' has a trigger "
                                                    f"'{trigger.name}' already"})
    if problems:
        raise TriggerInvalid("the trigger is invalid", problems)
    secret = signatures.secret_generate() if kind == TriggerKind.WEBHOOK else None
    with transaction.atomic():
        if secret:
            trigger.secret_ciphertext = sealing.seal(secret)
            trigger.secret_fingerprint = signatures.fingerprint(secret)
        trigger.schedule_anchor = now() if kind == TriggerKind.SCHEDULE else None
        trigger.save()
        _sync_beat(trigger)
        trigger_audit(trigger, action="trigger.created", actor=label(actor), outcome="created",
                      payload={"settings": _settings_of(trigger),
                               "secret_fingerprint": trigger.secret_fingerprint})
    return trigger, secret


def trigger_update(*, trigger_id, actor: Actor, changes: dict) -> Trigger:
    """Change a trigger's settings (`changes`: fields of EDITABLE). Raises Forbidden without
    trigger.manage in its team, TriggerInvalid listing every problem.

    A changed schedule, or a trigger enabled again, starts its slots afresh from now: the slots
    it passed while it was another schedule or disabled are not "missed".
    """
    with transaction.atomic():
        trigger = trigger_lock(trigger_id)
        require(actor, Action.TRIGGER_MANAGE, team=trigger.team)
        _unknown(changes, trigger.kind)
        changes = _normalized(changes)
        _resolve_workflow(trigger.team, changes)
        before = _settings_of(trigger)
        for name, value in changes.items():
            setattr(trigger, name, value)
        problems = trigger_problems(trigger, check_input=bool(INPUT_FIELDS & changes.keys()))
        if "name" in changes and Trigger.objects.filter(team=trigger.team, name=trigger.name
                                                        ).exclude(id=trigger.id).exists():
            problems.append({"path": "name", "message": "another trigger of the team has it"})
        if problems:
            raise TriggerInvalid("the trigger is invalid", problems)
        after = _settings_of(trigger)
        changed = {name: after[name] for name in after if after[name] != before[name]}
        if not changed:
            return trigger
        restarted = trigger.enabled and (not before["enabled"] or any(
            name in changed for name in SCHEDULE_FIELDS))
        if trigger.kind == TriggerKind.SCHEDULE and restarted:
            trigger.schedule_anchor, trigger.last_slot = now(), None
        _changed_by(trigger, actor)
        trigger.save()
        _sync_beat(trigger)
        action = ("trigger.enabled" if changed.keys() == {"enabled"} and trigger.enabled else
                  "trigger.disabled" if changed.keys() == {"enabled"} else "trigger.updated")
        trigger_audit(trigger, action=action, actor=label(actor), outcome=action.split(".")[1],
                      payload={"changed": changed, "revision": trigger.revision})
    return trigger


def webhook_secret_rotate(*, trigger_id, actor: Actor) -> tuple[Trigger, str]:
    """Give a webhook a new secret and return it (shown once). The old one still verifies for
    ROTATION_GRACE, so senders can switch over. Raises Forbidden, TriggerInvalid (not a webhook).
    """
    secret = signatures.secret_generate()
    with transaction.atomic():
        trigger = trigger_lock(trigger_id)
        require(actor, Action.TRIGGER_MANAGE, team=trigger.team)
        if trigger.kind != TriggerKind.WEBHOOK:
            raise TriggerInvalid("only a webhook has a secret", [{"path": "kind", "message":
                                 f"trigger '{trigger.name}' is a {trigger.kind}, not a webhook"}])
        old_fingerprint = trigger.secret_fingerprint
        trigger.previous_secret_ciphertext = trigger.secret_ciphertext
        trigger.previous_secret_until = now() + ROTATION_GRACE
        trigger.secret_ciphertext = sealing.seal(secret)
        trigger.secret_fingerprint = signatures.fingerprint(secret)
        _changed_by(trigger, actor)
        trigger.save()
        trigger_audit(trigger, action="trigger.secret_rotated", actor=label(actor),
                      outcome="rotated", payload={
                          "secret_fingerprint": trigger.secret_fingerprint,
                          "previous_fingerprint": old_fingerprint,
                          "previous_valid_until": trigger.previous_secret_until.isoformat()})
    return trigger, secret


def _changed_by(trigger: Trigger, actor: Actor) -> None:
    """Record a change: the runs the trigger starts from now on name this person among
    those who set them in motion (`firing.trigger_provenance`). The engine changing a
    trigger leaves the last person in place."""
    trigger.updated_at = now()
    trigger.revision += 1
    if person(actor) is not None:
        trigger.updated_by = person(actor)


def triggers_reseal() -> int:
    """Re-encrypt every webhook secret under the current STEPWISE_TRIGGER_KEY (after a key
    rotation, with the old key in STEPWISE_TRIGGER_KEY_FALLBACKS). Returns how many."""
    done = 0
    for trigger_id in Trigger.objects.filter(kind=TriggerKind.WEBHOOK).values_list("id", flat=True):
        with transaction.atomic():
            trigger = trigger_lock(trigger_id)
            trigger.secret_ciphertext = sealing.reseal(trigger.secret_ciphertext)
            if trigger.previous_secret_ciphertext:
                trigger.previous_secret_ciphertext = sealing.reseal(trigger.previous_secret_ciphertext)
            trigger.save(update_fields=["secret_ciphertext", "previous_secret_ciphertext"])
            done += 1
    return done


def _sync_beat(trigger: Trigger) -> None:
    """Write the schedule's PeriodicTask; beat's DatabaseScheduler notices the change itself."""
    if trigger.kind != TriggerKind.SCHEDULE:
        return
    task = trigger.periodic_task or PeriodicTask(name=f"stepwise-trigger-{trigger.id}")
    if trigger.cron:
        minute, hour, day_of_month, month_of_year, day_of_week = cron_fields(trigger.cron)
        task.crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
            day_of_week=day_of_week, timezone=trigger.timezone)
        task.interval = None
    else:
        task.interval, _ = IntervalSchedule.objects.get_or_create(
            every=trigger.interval_s, period=IntervalSchedule.SECONDS)
        task.crontab = None
    task.task = SCHEDULE_TASK
    task.args = json.dumps([str(trigger.id)])
    task.queue = "orchestrator"
    task.enabled = trigger.enabled
    task.description = f"Stepwise trigger {trigger.team.slug}/{trigger.name}"
    task.save()
    if trigger.periodic_task_id != task.id:
        trigger.periodic_task = task
        trigger.save(update_fields=["periodic_task"])
