"""The lease heartbeat (`orchestrator.engine.leases.heartbeat`): a renewal every third of a lease on
a thread of its own, stopped by the block's end or by a renewal that says the work moved on, and
run by threads kept for the next block, so a step starts no thread of its own."""
import threading
import time

import pytest

from orchestrator.engine import leases
from orchestrator.engine.leases import heartbeat


@pytest.fixture
def short_lease(settings):
    settings.STEPWISE_LEASE_S = 0.3  # a beat every 0.1 s


def beaters() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("beat-", "heartbeat"))]


def test_a_block_is_renewed_every_third_of_a_lease_until_it_ends(short_lease):
    renewals = []
    with heartbeat(lambda: renewals.append(time.monotonic()) or True, name="beat-a"):
        time.sleep(0.55)
    count = len(renewals)
    time.sleep(0.3)

    assert 3 <= count <= 6
    assert len(renewals) == count  # none after the block ended


def test_a_renewal_that_says_the_work_moved_on_stops_the_beats(short_lease):
    renewals = []
    with heartbeat(lambda: renewals.append(1) and False, name="beat-b"):
        time.sleep(0.45)
    assert renewals == [1]


def test_a_renewal_that_raises_is_tried_again_at_the_next_beat(short_lease):
    tries = []

    def renew():
        tries.append(1)
        raise ConnectionError("the database is restarting")

    with heartbeat(renew, name="beat-c"):
        time.sleep(0.45)
    assert len(tries) >= 3


def idle_again(count: int) -> None:
    """Wait until `count` threads are idle: a block's thread returns after its block ends."""
    deadline = time.monotonic() + 5
    while leases._BEATERS.idle < count and time.monotonic() < deadline:
        time.sleep(0.005)


def serving(name: str) -> list[threading.Thread]:
    """The thread that has taken up the block named `name`, once it has (a loaded machine may
    take a while to schedule it)."""
    deadline = time.monotonic() + 5
    while not (found := [t for t in beaters() if t.name == name]) and time.monotonic() < deadline:
        time.sleep(0.005)
    return found


def test_blocks_one_after_another_reuse_one_thread(short_lease):
    with heartbeat(lambda: True, name="beat-warm"):
        pass
    idle_again(1)
    idle = leases._BEATERS.idle
    before = beaters()

    seen: list[threading.Thread] = []  # the objects themselves: a new thread is a new object
    for i in range(20):
        with heartbeat(lambda: True, name=f"beat-{i}"):
            seen += serving(f"beat-{i}")
        idle_again(idle)  # its beat returns its thread

    assert len(seen) == 20
    assert all(any(t is b for b in before) for t in seen)  # no block started a thread


def test_blocks_at_the_same_time_each_have_a_thread(short_lease):
    renewed = {"x": 0, "y": 0}

    def renew(key):
        renewed[key] += 1
        return True

    with heartbeat(lambda: renew("x"), name="beat-x"), heartbeat(lambda: renew("y"), name="beat-y"):
        time.sleep(0.45)
    assert renewed["x"] >= 2 and renewed["y"] >= 2
