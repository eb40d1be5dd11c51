"""A module of code scorers, named in STEPWISE_EVALUATION_SCORERS by the registry's test."""
from evaluation.scorers import scorer


@scorer("sample_order_matches")
def order_matches(outcome: dict, expected: dict, case: dict) -> bool | None:
    """The refund is for the order the case is about."""
    action = (outcome["steps"].get("propose") or {}).get("action")
    if not action or action["name"] != "refund":
        return None
    return action["params"].get("order_id") == case["input"]["order_id"]
