"""Commit-to-screen latency of the live pages: from a committed transition to a client that
has re-read the state showing it.

What a page does is reproduced without a browser: a websocket client on `/ws/runs/` (the run
list's socket, signed in with a Django session) and, on a nudge, a re-read of the run
through the API (nudges that arrive during a read are coalesced into one more read per run, as
`static/stepwise/live_socket.js` does) (`GET /api/v1/runs/<id>/`, whose `last_event` says what the read saw). Runs of
the N-step chain are started one at a time through the API; afterwards each of their outbox
events (three or more per step: queued, running, completed, and the run's own) is matched to
the first re-read whose `last_event` covers it:

    latency = that re-read's answer time - the event's `created_at`

`created_at` is stamped inside the transaction, a little before its commit, so the figure
includes the commit itself; both clocks are this machine's. The web process's relay, the
channel layer and the websocket are the real ones (uvicorn, as `make run`).
"""
from __future__ import annotations

import json
import threading
import time

from .stats import summary


def _session_cookie(user) -> str:
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.utils.module_loading import import_string

    store = import_string(f"{settings.SESSION_ENGINE}.SessionStore")()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    return f"{settings.SESSION_COOKIE_NAME}={store.session_key}"


def commit_to_screen(base_url: str, token: str, workflow: str, *, runs: int, deadline: float,
                     ended=("completed", "failed", "cancelled", "timed_out")) -> dict:
    """Start `runs` runs one at a time while a websocket client re-reads on every nudge;
    return the latency summary (ms) over every event of those runs."""
    import httpx
    from django.contrib.auth import get_user_model
    from websockets.sync.client import connect

    from orchestrator.models import Event, Run

    user = get_user_model().objects.get(username="bench")
    reads: list[tuple[str, int, float]] = []  # (run id, last_event seen, answered at)
    stop = threading.Event()
    host = base_url.removeprefix("http://")
    headers = {"Authorization": f"Token {token}"}

    def listen(socket) -> None:
        with httpx.Client(base_url=base_url, timeout=30, headers=headers) as http:
            while not stop.is_set():
                try:
                    nudge = json.loads(socket.recv(timeout=0.5))
                except TimeoutError:
                    continue
                except Exception:  # the socket closed: the measurement ends
                    return
                # As the pages do (live_socket.js), reads never overlap and nudges that came
                # during one read are served by one more: drain what is queued, then read each
                # run it names once.
                nudged = {nudge["run"]} if "run" in nudge else set()
                while True:
                    try:
                        more = json.loads(socket.recv(timeout=0))
                    except TimeoutError:
                        break
                    except Exception:
                        return
                    if "run" in more:
                        nudged.add(more["run"])
                for run_id in nudged:
                    body = http.get(f"/api/v1/runs/{run_id}/").json()
                    reads.append((run_id, body["last_event"], time.time()))

    started: list[str] = []
    with connect(f"ws://{host}/ws/runs/", origin=base_url, open_timeout=10,
                 additional_headers={"Cookie": _session_cookie(user)}) as socket:
        socket.recv(timeout=10)  # the greeting: re-read now
        listener = threading.Thread(target=listen, args=(socket,), daemon=True)
        listener.start()
        with httpx.Client(base_url=base_url, timeout=30, headers=headers) as http:
            for _ in range(runs):
                response = http.post(f"/api/v1/workflows/{workflow}/runs/", json={"input": {}})
                run_id = response.json()["id"]
                started.append(run_id)
                while not Run.objects.filter(id=run_id, state__in=ended).exists():
                    if time.time() > deadline:
                        break
                    time.sleep(0.02)
        last = Event.objects.filter(run_id__in=started).order_by("-id").values_list("id", flat=True).first()
        settle = time.time() + 5  # the last nudge's re-read
        while time.time() < min(settle, deadline) and not any(seen >= (last or 0) for _, seen, _ in reads):
            time.sleep(0.02)
        stop.set()
        listener.join(timeout=5)

    latencies, missed = [], 0
    by_run: dict[str, list[tuple[int, float]]] = {}
    for run_id, seen, at in reads:
        by_run.setdefault(run_id, []).append((seen, at))
    for run_id, event_id, created in Event.objects.filter(run_id__in=started).values_list(
            "run_id", "id", "created_at"):
        shown = [at for seen, at in by_run.get(str(run_id), []) if seen >= event_id]
        if shown:
            latencies.append((min(shown) - created.timestamp()) * 1000)
        else:
            missed += 1
    return {"latency_ms": summary(latencies), "events": len(latencies) + missed,
            "never_shown": missed, "runs": len(started), "reads": len(reads)}
