"""Router steps: choose one route by rules (first matching CEL condition) or by score.

The choice is data ({"route", "score"}); the scheduler skips the branches not chosen.
"""
from ..definitions import ExpressionError, evaluate_expression
from ..retry import StepError
from . import ExecContext, Result


def choose(spec: dict, step_input: dict) -> dict:
    try:
        if spec["strategy"] == "score":
            score = evaluate_expression(spec["score"], step_input)
            if isinstance(score, bool) or not isinstance(score, int | float):
                raise StepError("validation", f"score must be a number, got {score!r}")
            for route in spec["routes"]:
                if score >= route["min"]:
                    return {"route": route["name"], "score": score}
            return {"route": spec["default"]["name"], "score": score}
        for route in spec["routes"]:
            if evaluate_expression(route["when"], step_input) is True:
                return {"route": route["name"]}
    except ExpressionError as exc:
        raise StepError("validation", f"route condition could not be evaluated: {exc}") from exc
    return {"route": spec["default"]["name"]}


def run(spec: dict, step_input: dict, ctx: ExecContext) -> Result:
    return Result(choose(spec, step_input))
