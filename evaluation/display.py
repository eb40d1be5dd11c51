"""How an evaluation's results are shown in the admin: metrics per risk tier as tables, each
value with its 95% interval drawn as a small inline SVG bar with whiskers, which way is better
for a metric, and why a case failed.

A summary is read per tier as `{"cases", "passed", "metrics": {name: figure}}`
(`evaluation.summary.summarize`), a figure `{"kind"?, "n", "value", "ci": [low, high] | null}`; a metric
is named `<base>` or `<base>:<step>` (`action:propose`), and what it is (a share or a mean,
which way is better) is `evaluation.metrics`'. Presentation only: it reads summaries and scores
as stored and decides nothing; what passes is the scorers' and the release gate's to say.
"""
from decimal import Decimal

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from orchestrator.web.admin_display import money

from .metrics import LOWER, NEUTRAL, PROPORTION, metric_of

#: The order tiers are shown in: the whole first, then where a wrong outcome costs most.
TIERS = ("overall", "high", "medium", "low")

#: What a metric is called on a page.
LABELS = {"run_state": "run state", "approval_routing": "approval routing", "action": "action",
          "action_params": "action parameters", "labels": "labels", "output": "output",
          "abstention": "abstention", "evidence_present": "evidence present",
          "unauthorized_actions": "unauthorized actions", "review_volume": "review volume",
          "rejections": "rejections", "compensations": "compensations",
          "duplicates_prevented": "duplicates prevented", "stuck": "stuck", "latency_s": "latency",
          "cost_usd": "cost per case", "tokens": "tokens per case", "started": "run started",
          "pass_rate": "passed", "passed": "passed", "action_accuracy": "action accuracy",
          "extraction_accuracy": "extraction accuracy", "abstention_accuracy": "abstention accuracy",
          "evidence": "evidence present", "rubric": "rubric passed", "rubric_score": "rubric score",
          "rubric_pass": "rubric passed", "rubric_mean": "rubric score", "scorer_pass": "code scorers passed"}

BAR_WIDTH, BAR_HEIGHT, PAD = 120, 14, 4


def base_of(metric: str) -> str:
    return metric.split(":", 1)[0]


def label(metric: str) -> str:
    """`action:propose` reads "action (propose)"."""
    base, _, step = metric.partition(":")
    name = LABELS.get(base, base.replace("_", " "))
    return f"{name} ({step})" if step else name


def is_proportion(metric: str, figure=None) -> bool:
    """A share of cases (else a count or a mean): as the figure says, else as `metrics` knows it."""
    if isinstance(figure, dict) and figure.get("kind"):
        return figure["kind"] == PROPORTION
    return metric_of(metric).kind == PROPORTION


def lower_is_better(metric: str) -> bool:
    return metric_of(metric).better == LOWER


def metrics_of(tier) -> dict:
    """A tier's figures by metric name ({} for a tier without cases, or none stored)."""
    return (tier.get("metrics") or {}) if isinstance(tier, dict) else {}


def show(metric: str, value, proportion: bool | None = None) -> str:
    """A metric's value as a person reads it: a share as a percentage, a cost in dollars, a
    latency in seconds, a count with two decimals."""
    if value is None:
        return "–"
    if proportion if proportion is not None else is_proportion(metric):
        return f"{float(value) * 100:.1f}%"
    if base_of(metric) == "cost_usd":
        return money(Decimal(str(value)))
    if base_of(metric) == "latency_s":
        return f"{float(value):.2f} s"
    return f"{float(value):.2f}"


def show_delta(metric: str, delta, proportion: bool | None = None) -> str:
    if delta is None:
        return "–"
    if proportion if proportion is not None else is_proportion(metric):
        return f"{float(delta) * 100:+.1f} pts"
    if base_of(metric) == "cost_usd":
        return ("+" if delta >= 0 else "-") + money(abs(Decimal(str(delta))))
    return f"{float(delta):+.2f}{' s' if base_of(metric) == 'latency_s' else ''}"


def tone(metric: str, delta) -> str:
    """"better", "worse" or "same" (also for a metric neither way is better) for a change of
    `delta` in `metric`."""
    if delta is None or abs(float(delta)) < 1e-9 or metric_of(metric).better == NEUTRAL:
        return "same"
    up = float(delta) > 0
    return "worse" if up == lower_is_better(metric) else "better"


def _measure(entry) -> tuple[float | None, float | None, float | None, int | None]:
    """(value, low, high, n) of a summary entry `{"n", "value", "ci": [lo, hi]}`; a bare number
    is a value without an interval."""
    if isinstance(entry, dict):
        ci = entry.get("ci") or [None, None]
        low, high = (ci + [None, None])[:2] if isinstance(ci, list) else (None, None)
        return _num(entry.get("value")), _num(low), _num(high), entry.get("n")
    return _num(entry), None, None, None


def _num(value) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, int | float | Decimal) else None


def scale_of(metric: str, entries) -> float:
    """The top of the axis a metric's bars share: 1 for a share, else the largest value or
    interval end among `entries` (so bars of one metric compare across tiers and evaluations)."""
    if is_proportion(metric, next(iter(entries), None)):
        return 1.0
    tops = [x for entry in entries for x in _measure(entry)[:3] if x is not None]
    return max([*tops, 1e-9])


def ci_bar(metric: str, entries, scale: float, *, tones=("base",)) -> SafeString:
    """One small SVG: per entry a line from the interval's low to its high end with whiskers,
    and a dot at the value, on an axis from 0 to `scale`; entries are drawn one under another
    (a comparison draws the base and the new one)."""
    rows = len(entries)
    height = BAR_HEIGHT * rows
    def x(v: float) -> str:
        return f"{PAD + (BAR_WIDTH - 2 * PAD) * max(0.0, min(1.0, v / scale if scale else 0)):.1f}"

    parts = [format_html('<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>', PAD, BAR_WIDTH - PAD,
                         height - 1, height - 1)]
    titles = []
    proportion = is_proportion(metric, next((e for e in entries if e is not None), None))
    for row, (entry, kind) in enumerate(zip(entries, tones, strict=False)):
        value, low, high, n = _measure(entry)
        mid = BAR_HEIGHT * row + BAR_HEIGHT // 2
        if low is not None and high is not None:
            parts.append(format_html(
                '<line class="ci {}" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<line class="ci {}" x1="{}" x2="{}" y1="{}" y2="{}"/>'
                '<line class="ci {}" x1="{}" x2="{}" y1="{}" y2="{}"/>',
                kind, x(low), x(high), mid, mid, kind, x(low), x(low), mid - 4, mid + 4,
                kind, x(high), x(high), mid - 4, mid + 4))
        if value is not None:
            parts.append(format_html('<circle class="value {}" cx="{}" cy="{}" r="3"/>', kind, x(value), mid))
        interval = f", 95% interval {show(metric, low, proportion)} to {show(metric, high, proportion)}" \
            if low is not None else ""
        titles.append(f"{label(metric)}: {show(metric, value, proportion)}{interval}" +
                      (f", n={n}" if n is not None else ""))
    return format_html('<svg class="ci-bar" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
                       'aria-label="{}"><title>{}</title>{}</svg>', BAR_WIDTH, height, BAR_WIDTH, height,
                       "; ".join(titles), "; ".join(titles), mark_safe("".join(parts)))


def tier_table(summary: dict | None) -> dict:
    """Every metric of a summary as rows, with a cell per tier: {"tiers": [...], "rows": [
    {"metric", "label", "cells": [{"text", "interval", "n", "bar"} | None]}]}."""
    by_tier = {t: metrics_of((summary or {}).get(t)) for t in TIERS}
    tiers = [t for t in TIERS if by_tier[t]]
    metrics = sorted({m for t in tiers for m in by_tier[t]}, key=_metric_order)
    rows = []
    for metric in metrics:
        entries = [by_tier[t].get(metric) for t in tiers]
        scale = scale_of(metric, [e for e in entries if e is not None])
        cells = []
        for entry in entries:
            if entry is None:
                cells.append(None)
                continue
            cells.append({**_cell(metric, entry), "bar": ci_bar(metric, [entry], scale)})
        rows.append({"metric": metric, "label": label(metric), "cells": cells})
    return {"tiers": tiers, "rows": rows}


def side_by_side(base: dict | None, new: dict | None, deltas: dict | None) -> list[dict]:
    """Each tier's metrics of two summaries side by side: [{"tier", "rows": [{"metric", "label",
    "base", "new", "delta", "tone", "bar"}]}]; `deltas` is `scoring.compare`'s "tiers", whose
    delta is used where it gives one."""
    base, new, deltas = base or {}, new or {}, deltas or {}
    blocks = []
    for tier in TIERS:
        b, n = metrics_of(base.get(tier)), metrics_of(new.get(tier))
        if not (b or n):
            continue
        rows = []
        for metric in sorted(set(b) | set(n), key=_metric_order):
            given = ((deltas.get(tier) or {}).get(metric) or {}) if isinstance(deltas.get(tier), dict) else {}
            b_value, n_value = _measure(b.get(metric))[0], _measure(n.get(metric))[0]
            delta = _num(given.get("delta")) if isinstance(given, dict) and "delta" in given else (
                n_value - b_value if b_value is not None and n_value is not None else None)
            entries = [b.get(metric), n.get(metric)]
            proportion = is_proportion(metric, next((e for e in entries if e is not None), None))
            rows.append({"metric": metric, "label": label(metric),
                         "base": _cell(metric, b.get(metric)), "new": _cell(metric, n.get(metric)),
                         "delta": show_delta(metric, delta, proportion), "tone": tone(metric, delta),
                         "bar": ci_bar(metric, entries, scale_of(metric, [e for e in entries if e is not None]),
                                       tones=("base", "new"))})
        blocks.append({"tier": tier, "rows": rows})
    return blocks


def _cell(metric: str, entry) -> dict | None:
    if entry is None:
        return None
    value, low, high, n = _measure(entry)
    proportion = is_proportion(metric, entry)
    return {"text": show(metric, value, proportion), "n": n,
            "interval": f"{show(metric, low, proportion)} – {show(metric, high, proportion)}"
            if low is not None else ""}


#: The order metrics are listed in: whether cases passed, then what the run did, then per step.
ORDER = ("pass_rate", "passed", "unauthorized_actions", "approval_routing", "run_state", "action_accuracy",
         "action", "action_params", "extraction_accuracy", "labels", "output", "abstention_accuracy", "abstention",
         "evidence_present", "evidence", "rubric_pass", "rubric", "rubric_mean", "rubric_score", "scorer_pass",
         "review_volume", "rejections", "compensations", "duplicates_prevented", "stuck", "latency_s", "cost_usd",
         "tokens")


def _metric_order(metric: str) -> tuple:
    base = base_of(metric)
    return (ORDER.index(base) if base in ORDER else len(ORDER), metric)


def failing(scores: dict | None) -> list[str]:
    """Why a case did not pass, as metric labels: each share metric that is false, and
    unauthorized actions above 0."""
    scores = scores or {}
    found = [label(m) for m, v in sorted(scores.items(), key=lambda item: _metric_order(item[0]))
             if v is False and not lower_is_better(m)]
    found += [label(m) for m, v in scores.items() if v is True and lower_is_better(m)]
    if isinstance(scores.get("unauthorized_actions"), int | float) and not isinstance(
            scores["unauthorized_actions"], bool) and scores["unauthorized_actions"] > 0:
        found.append(f"{label('unauthorized_actions')} ({scores['unauthorized_actions']})")
    return found


def change_text(metric: str, value) -> str:
    """A case's score for one metric, as the comparison lists it."""
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "pass" if value else "fail"
    if isinstance(value, int | float):
        return show(metric, value) if not is_proportion(metric) else f"{value:g}"
    return str(value)


def threshold_rows(thresholds) -> list[dict]:
    """A release policy's thresholds as rows to read: {"tier", "measure", "limit"}, from its
    `tiers` (per tier, per measure: a number or `{"min"|"max"|...: number}`); anything else
    in it as a row of its own."""
    rows = []
    if not isinstance(thresholds, dict):
        return rows
    tiers = thresholds.get("tiers")
    for tier in [t for t in TIERS if isinstance(tiers, dict) and t in tiers] + \
            [t for t in (tiers or {}) if isinstance(tiers, dict) and t not in TIERS]:
        limits = tiers[tier]
        if not isinstance(limits, dict):
            rows.append({"tier": tier, "measure": "", "limit": _limit(limits)})
            continue
        for measure, limit in limits.items():
            if measure == "max_regression":  # the tier's own: every share of cases it measures
                rows.append({"tier": tier, "measure": "every share of cases",
                             "limit": f"falls at most {_points(limit)} against the published version"})
                continue
            rows.append({"tier": tier, "measure": label(measure), "limit": _limit(limit, measure)})
    for key, value in thresholds.items():
        if key != "tiers":
            rows.append({"tier": "", "measure": label(key), "limit": _limit(value)})
    return rows


SIGNS = {"min": "≥", "max": "≤", "equals": "=", "eq": "=", "max_regression": "falls at most"}


def _points(limit) -> str:
    return f"{limit * 100:g} pts" if isinstance(limit, int | float) and not isinstance(limit, bool) else str(limit)


def _limit(limit, measure: str = "") -> str:
    if isinstance(limit, dict):
        shown = ", ".join(f"{SIGNS.get(k, k.replace('_', ' '))} "
                          f"{_points(v) if k == 'max_regression' and is_proportion(measure) else _limit(v, measure)}"
                          for k, v in limit.items() if k != "bound")
        return shown + (" (on the 95% interval's far end)" if limit.get("bound") == "ci" else "")
    if isinstance(limit, bool) or limit is None:
        return str(limit).lower()
    if isinstance(limit, int | float) and measure and is_proportion(measure) and 0 < limit < 1:
        return f"{limit:g} ({limit * 100:g}%)"
    return f"{limit:g}" if isinstance(limit, int | float) else str(limit)
