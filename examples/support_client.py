"""The support example driven by a program, through the typed client (stepwise_client).

    STEPWISE_URL=http://127.0.0.1:8000 STEPWISE_TOKEN=<the admin's token, printed by make run> \\
        STEPWISE_APPROVER_TOKEN=<the reviewer's token, printed by make run> \\
        .venv/bin/python examples/support_client.py

Starts a support run as one program (idempotently: running it twice with the same ticket starts
one run), waits for its approval gate, lets a supervisor (another account: whoever started a
run may not approve it) approve the action they read, waits for the end, and prints each state.
"""
import os
import sys

from stepwise_client import Stepwise


def handle_ticket(stepwise: Stepwise, supervisor: Stepwise, ticket_id: str, body: str,
                  email: str) -> str:
    run = stepwise.start("support-reply", {"ticket_id": ticket_id, "body": body,
                                           "customer_email": email},
                         idempotency_key=f"ticket-{ticket_id}")
    print(f"run {run.id}: {run.state}")
    run = stepwise.wait(run.id, until={"waiting", "completed", "failed", "cancelled"})
    print(f"run {run.id}: {run.state}")
    for gate in supervisor.pending_approvals(run.id):
        supervisor.approve(gate, note="Approved by the support bot's supervisor")
        print(f"approved gate {gate.step}")
    run = stepwise.wait(run.id)
    print(f"run {run.id}: {run.state}")
    return run.state


def main() -> int:
    url = os.environ.get("STEPWISE_URL", "http://127.0.0.1:8000")
    with (Stepwise(url, token=os.environ["STEPWISE_TOKEN"]) as stepwise,
          Stepwise(url, token=os.environ["STEPWISE_APPROVER_TOKEN"]) as supervisor):
        state = handle_ticket(stepwise, supervisor, sys.argv[1] if len(sys.argv) > 1 else "T-100",
                              "I was charged twice, please refund", "c@example.com")
    return 0 if state == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
