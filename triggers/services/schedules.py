"""A beat tick of a schedule: which slots run now, and what became of the missed ones.

Beat's database scheduler sends `triggers.tasks.schedule_fire(trigger_id)` at the schedule's
times. The tick carries no time of its own: it reads the newest slot the schedule handled
(`Trigger.last_slot`) and `slots.plan_slots` says which slots are due. Each due slot fires with
the key `slot:<UTC time>`, which is also in the run's idempotency key, so a tick delivered
twice, a tick replayed from the broker or two beats by mistake still make one run per slot.
"""
from __future__ import annotations

from django.db import transaction

from orchestrator.clock import now

from ..models import Trigger, TriggerKind
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
            outcomes.append(fire(trigger, key=f"slot:{slot.isoformat()}", context={
                "slot": slot_text(slot, trigger.timezone), "slot_utc": slot.isoformat()},
                origin={"slot": slot.isoformat()}))
        if plan.newest:
            trigger.last_slot = plan.newest
            trigger.save(update_fields=["last_slot"])
    return outcomes
