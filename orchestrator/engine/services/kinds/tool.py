"""Tool steps on a worker: a registered tool called with the step's params (`executors.tool`).

What is particular to a tool: a side-effecting call goes through the effect ledger
(`effects.effect_perform`), once per idempotency key and only while the attempt still holds its
step (`worker.claim_holds`: fencing). Claiming, the lease, the outcome and retries are the
machinery every worker kind shares (`worker`).
"""
from functools import partial

from ...states import StepKind
from ..effects import effect_perform
from . import register
from .worker import Claim, WorkerStep, claim_holds


class ToolStep(WorkerStep):
    def call_hooks(self, claim: Claim, *, scrub) -> dict:
        return {"effects": partial(effect_perform, step_id=claim.step_id, key=claim.idempotency_key,
                                   fence=claim.attempt,
                                   holds=partial(claim_holds, step_id=claim.step_id, attempt=claim.attempt),
                                   scrub=scrub)}


register(StepKind.TOOL, ToolStep())
