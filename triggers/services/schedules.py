"""A beat tick of a schedule: which slots run now, and what became of the missed ones.

Beat's database scheduler sends `triggers.tasks.schedule_fire(trigger_id)` at the schedule's
times. The tick carries no time of its own: it reads the newest slot the schedule handled
(`Trigger.last_slot`) and `slots.plan_slots` says which slots are due. Each due slot fires with
the key `slot:<UTC time>`, which is also in the run's idempotency key, so a tick delivered
twice, a tick replayed from the broker or two beats by mistake still make one run per slot.
"""
from __future__ import annotations

from django.db import transaction

from alerts.rules import RuleKind
from alerts.services import alert_raise
from orchestrator.engine.clock import now

from ..models import Firing, Trigger, TriggerKind
from ..selectors import trigger_actor
from ..slots import Schedule, plan_slots, schedule_problems, slot_label, slot_text, slots_after
from .firing import FireOutcome, fire, trigger_audit, trigger_lock


def schedule_of(trigger: Trigger) -> Schedule:
    return Schedule(cron=trigger.cron, timezone=trigger.timezone, interval_s=trigger.interval_s,
                    anchor=trigger.schedule_anchor)


def next_slots(schedule: Schedule, *, last_slot=None, count: int = 5) -> tuple[list[dict], list[dict]]:
    """(the schedule's next `count` slots, its problems): each slot as {"at": UTC ISO 8601,
    "label": "Mon 7 Dec 09:00 CET" in the schedule's zone}. No slots when it has a problem.

    A schedule being edited passes no anchor: saved, its slots would start from now.
    """
    problems = schedule_problems(schedule)
    if problems:
        return [], problems
    moment = now()
    if schedule.anchor is None and schedule.interval_s:
        schedule = Schedule(schedule.cron, schedule.timezone, schedule.interval_s, anchor=moment)
    after = max(moment, last_slot) if last_slot else moment
    slots = slots_after(schedule, after=after, count=count)
    return [{"at": slot.isoformat(), "label": slot_label(slot, schedule.timezone)}
            for slot in slots], []


def schedule_tick(*, trigger_id) -> list[FireOutcome]:
    """Fire the due slots of a schedule (none for a disabled or unknown trigger)."""
    with transaction.atomic():
        trigger = Trigger.objects.filter(id=trigger_id, kind=TriggerKind.SCHEDULE).first()
        if trigger is None:
            return []
        trigger = trigger_lock(trigger_id)
        if not trigger.enabled or trigger.schedule_anchor is None:
            return []
        plan = plan_slots(schedule_of(trigger), last=trigger.last_slot, now=now(),
                          missed=trigger.missed_slots, catch_up_max=trigger.catch_up_max)
        if plan.skipped:
            trigger_audit(trigger, action="trigger.slots_skipped", actor=str(trigger_actor(trigger)),
                          outcome="skipped", payload={
                              "count": plan.skipped, "policy": trigger.missed_slots,
                              "first": plan.skipped_first.isoformat(),
                              "last": plan.skipped_last.isoformat()})
        outcomes = []
        for slot in plan.fire:
            key, origin = f"slot:{slot.isoformat()}", {"slot": slot.isoformat()}
            outcome = fire(trigger, key=key, context={
                "slot": slot_text(slot, trigger.timezone), "slot_utc": slot.isoformat()},
                origin=origin)
            if not outcome.accepted:
                outcome.firing = _refused(trigger, key=key, origin=origin, outcome=outcome)
            outcomes.append(outcome)
        if plan.newest:
            trigger.last_slot = plan.newest
            trigger.save(update_fields=["last_slot"])
    return outcomes


def _refused(trigger: Trigger, *, key: str, origin: dict, outcome: FireOutcome) -> Firing:
    """Keep a slot that started no run where its owner looks: a refused firing with the reason
    in the trigger's firings, and an alert to the team (once per trigger and reason until the
    trigger is changed, not once a slot)."""
    firing = Firing.objects.create(trigger=trigger, key=key, state=Firing.State.REFUSED,
                                   origin=origin, reason=outcome.reason[:32],
                                   problems=outcome.problems)
    reasons = "; ".join(f"{p['path']}: {p['message']}" if p.get("path") else p["message"]
                        for p in outcome.problems) or outcome.reason
    alert_raise(RuleKind.TRIGGER_REFUSED, team=trigger.team, workflow_id=trigger.workflow_id,
                key=f"trigger.refused:{trigger.id}:{trigger.updated_at.isoformat()}:{outcome.reason}",
                subject=f"Schedule {trigger.team.slug}/{trigger.name} started no run "
                        f"({outcome.reason})",
                body=f"The slot {origin['slot']} of schedule '{trigger.name}' (workflow "
                     f"'{trigger.workflow.name}') started no run: {reasons}. Its next slots are "
                     "refused the same way until the trigger or the workflow is fixed; the "
                     "trigger's firings list each refused slot.")
    return firing
