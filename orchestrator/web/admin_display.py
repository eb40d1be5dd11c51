"""What every admin screen shares: read-only access scoped to the viewer's teams, and how JSON
documents and states are shown (styled by static/stepwise/admin.css)."""
import json
from decimal import Decimal, InvalidOperation

from django.contrib import admin
from django.utils.html import format_html

from orchestrator.engine.authz import teams_visible_to, visible
from orchestrator.engine.text import replaced


class ReadOnlyAdminMixin:
    """Never added, changed or deleted here: every change goes through a service, called by an
    admin action or the API.
    """

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class TeamScopedAdminMixin:
    """Shows a person the objects of their teams only, as the API does (`authz.visible`);
    a person with no team sees nothing. Model permissions play no part: staff grants nothing."""

    team_field = "team"

    def get_queryset(self, request):
        return visible(super().get_queryset(request), request.user, team_field=self.team_field)

    def has_view_permission(self, request, obj=None) -> bool:
        # Asked of every team-scoped model on each admin page (its menu): read once a request.
        if not hasattr(request, "stepwise_sees_a_team"):
            request.stepwise_sees_a_team = teams_visible_to(request.user).exists()
        return request.stepwise_sees_a_team

    def has_module_permission(self, request) -> bool:
        return self.has_view_permission(request)


# Which colour a state is shown in: the ones that need a person stand out.
STATE_TONES = {
    "completed": "good", "approved": "good", "succeeded": "good",
    "failed": "bad", "timed_out": "bad", "compensation_failed": "bad", "rejected": "bad",
    "expired": "bad", "dead": "bad",
    "waiting": "attention", "paused": "attention", "pending": "attention", "retrying": "attention",
    "compensating": "attention", "cancelling": "attention",
    "open": "attention",
    "running": "busy", "queued": "busy", "started": "busy",
}


def pretty_json(value) -> str:
    # Text stored before entries refused lone surrogates is shown replaced, never a 500.
    return format_html('<pre class="stepwise-json">{}</pre>',
                       json.dumps(replaced(value), indent=2, ensure_ascii=False, default=str))


def state_badge(state: str) -> str:
    return format_html('<span class="state-badge state-{}">{}</span>',
                       STATE_TONES.get(state, "quiet"), state.replace("_", " "))


def badge_column(field: str):
    """A list_display column showing `field` (a state or status) as a badge, sortable by it."""
    @admin.display(description=field, ordering=field)
    def column(obj) -> str:
        return state_badge(getattr(obj, field))
    column.__name__ = f"{field}_badge"
    return column


def money(amount) -> str:
    """US dollars as a person reads them: two decimals with thousands separators, and two
    significant digits for amounts under a cent (a model call often costs a fraction of one),
    so `0.000420` reads `$0.00042`, never `$0.00`."""
    try:
        value = Decimal(str(amount))
    except (InvalidOperation, ValueError):
        return str(amount)
    sign, value = ("-", -value) if value < 0 else ("", value)
    if value == 0 or value >= Decimal("0.01"):
        return f"{sign}${value:,.2f}"
    digits = -value.adjusted() + 1  # two significant digits
    return f"{sign}${value:.{digits}f}".rstrip("0")
