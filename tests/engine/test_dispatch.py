"""Messages ask for no result: a sender never waits on the result backend.

A task sent by name subscribes its sender to the task's result channel unless it is sent with
`ignore_result`. On the Redis result backend each send then needed Redis for that
subscription: while Redis was down a send retried for 20 s and failed, and the reaper's
re-sends of lost messages failed with it, so queued steps stayed queued after an outage.
"""
import pytest
from celery import current_app
from celery.signals import before_task_publish
from django.db import transaction

from orchestrator.engine import dispatch

pytestmark = pytest.mark.django_db

# Sent to a queue no worker consumes, for ids no row has: nothing runs them.
QUEUE = "test.unconsumed"


@pytest.fixture
def published():
    seen: list[tuple[str, dict]] = []

    def record(sender=None, headers=None, **kwargs):
        seen.append((sender, headers or {}))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


def test_every_message_the_engine_sends_asks_for_no_result(published, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        dispatch.step_dispatch_on_commit(999_001, QUEUE, step_name="s")
        dispatch.retry_due_on_commit(999_001, 3600)
        dispatch.map_items_redispatch_on_commit(999_002, {0: 3600}, QUEUE)
        dispatch.child_finished_on_commit(999_003)
        dispatch.compensate_on_commit("00000000-0000-0000-0000-000000000000", 3600)
        dispatch.callback_on_commit(999_004)

    assert sorted(task for task, _ in published) == sorted([
        "orchestrator.tasks.execute_step", "orchestrator.tasks.retry_due",
        "orchestrator.tasks.map_item", "orchestrator.tasks.child_finished",
        "orchestrator.tasks.compensate_run", "notifications.tasks.deliver_callback"])
    assert all(headers.get("ignore_result") is True for _, headers in published), published


def test_a_message_is_sent_while_the_result_backend_is_unreachable(
        published, django_capture_on_commit_callbacks):
    """Redis as the result backend, down (nothing listens on the port): the step's message still
    goes to the broker at once. Asking for its result, the send waited on the result backend's
    reconnection and then failed, and the message was never sent."""
    from celery.backends.redis import RedisBackend

    configured, current_app._backend = current_app._backend, RedisBackend(
        app=current_app, url="redis://127.0.0.1:9/0")
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            dispatch.step_dispatch_on_commit(999_005, QUEUE, step_name="s")
    finally:
        current_app._backend = configured

    assert [task for task, _ in published] == ["orchestrator.tasks.execute_step"]


def test_a_maps_items_keep_their_results_for_the_chord_that_counts_them(
        published, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        dispatch.map_dispatch_on_commit(999_006, [0, 1], QUEUE)

    items = [headers for task, headers in published if task == "orchestrator.tasks.map_item"]
    assert len(items) == 2
    assert all(headers.get("ignore_result") is False for headers in items), items
