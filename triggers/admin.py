"""Admin screens for triggers, their firings and event dead letters (a team's cap on
unfinished runs is its budget limit's, on the budgets' admin page).

Creating or changing a trigger here goes through `trigger_create` / `trigger_update`, the same
services as the API, which check `trigger.manage` and audit the change; the form only shows
their problems next to the fields. A webhook's secret is shown once, on the page that follows
its creation or a rotation, and is never stored in a message, a cookie or a log. Firings and
dead letters are read-only; "Replay selected" calls `event_dead_letter_replay`.
"""
from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from orchestrator.engine.authz import Action, may, teams_where, visible
from orchestrator.engine.errors import Forbidden, NotAllowed, ServiceError
from orchestrator.models import Workflow
from orchestrator.web.admin_display import (
    ReadOnlyAdminMixin,
    TeamScopedAdminMixin,
    badge_column,
    pretty_json,
)

from .models import EventDeadLetter, Firing, Trigger, TriggerKind
from .services.config import (
    EDITABLE,
    INPUT_FIELDS,
    KIND_FIELDS,
    trigger_create,
    trigger_problems,
    trigger_update,
    webhook_secret_rotate,
)
from .services.events import event_dead_letter_replay
from .services.schedules import next_slots, schedule_of
from .slots import Schedule

COMMON_FIELDS = [name for name in EDITABLE if not any(name in f for f in KIND_FIELDS.values())]
ADMISSION_FIELDS = ["max_per_minute", "when_limited", "max_queued"]


class TriggerForm(forms.ModelForm):
    class Meta:
        model = Trigger
        fields = ["team", "kind", *EDITABLE]

    def __init__(self, *args, user=None, **kwargs):
        super().__init__(*args, **kwargs)
        if "team" in self.fields:
            self.fields["team"].queryset = teams_where(user, Action.TRIGGER_MANAGE)
        if "workflow" in self.fields:
            self.fields["workflow"].queryset = visible(Workflow.objects.select_related("team"), user)

    def _post_clean(self):
        super()._post_clean()  # the cleaned values are now on the instance
        trigger = self.instance
        data = self.cleaned_data
        if data.get("workflow") and data.get("team") and data["workflow"].team_id != data["team"].id:
            self.add_error("workflow", "pick a workflow of the trigger's team")
            return
        if not trigger.workflow_id or self.errors:
            return
        check_input = self.instance._state.adding or bool(INPUT_FIELDS & set(self.changed_data))
        for problem in trigger_problems(trigger, check_input=check_input):
            field = problem["path"].split(".")[0].split("[")[0]
            self.add_error(field if field in self.fields else None, problem["message"])


@admin.register(Trigger)
class TriggerAdmin(TeamScopedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "team", "kind", "workflow", "enabled", "when", "last_slot", "updated_at"]
    list_filter = ["kind", "enabled", "team"]
    list_select_related = ["team", "workflow"]
    search_fields = ["name", "description", "workflow__name"]
    form = TriggerForm
    actions = ["enable_selected", "disable_selected", "rotate_secret"]
    readonly_fields = ["webhook_url", "secret_fingerprint", "previous_secret_until", "next_slots",
                       "last_slot", "recent_firings", "created_by", "updated_by", "revision",
                       "created_at", "updated_at"]

    def get_fieldsets(self, request, obj=None):
        head = ["team", "kind"] if obj is None else []
        kind_sections = []
        for kind, fields in KIND_FIELDS.items():
            if fields and (obj is None or obj.kind == kind):
                shown = [f for f in EDITABLE if f in fields]
                if kind == TriggerKind.SCHEDULE:
                    shown += ["next_slots", "last_slot"]
                if kind == TriggerKind.WEBHOOK and obj is not None:
                    shown = ["webhook_url", "secret_fingerprint", "previous_secret_until", *shown]
                kind_sections.append((f"{TriggerKind(kind).label.split(':')[0]} settings",
                                      {"fields": shown}))
        tail = [("History", {"fields": ["recent_firings", "created_by", "created_at",
                                        "updated_by", "updated_at", "revision"]})
                ] if obj is not None else []
        common = [name for name in COMMON_FIELDS if name not in ADMISSION_FIELDS]
        return [(None, {"fields": [*head, *common]}),
                ("Admission control", {"fields": ADMISSION_FIELDS}),
                *kind_sections, *tail]

    def get_form(self, request, obj=None, change=False, **kwargs):
        # The form has the fields the page shows (Django flattens the fieldsets): a trigger's
        # team and kind, and the settings of other kinds, are neither shown nor required on
        # its change page.
        form = super().get_form(request, obj, change=change, **kwargs)

        class ScopedForm(form):
            def __init__(self, *args, **inner):
                super().__init__(*args, user=request.user, **inner)
        return ScopedForm

    # --- who may do what (the services check again) -------------------------------------------

    def has_add_permission(self, request) -> bool:
        return teams_where(request.user, Action.TRIGGER_MANAGE).exists()

    def has_change_permission(self, request, obj=None) -> bool:
        if obj is None:
            return self.has_add_permission(request)
        return may(request.user, Action.TRIGGER_MANAGE, team=obj.team)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # disabled, never deleted: every run keeps the trigger that started it

    def has_manage_permission(self, request) -> bool:
        return self.has_add_permission(request)

    # --- saving through the services -------------------------------------------------------

    def save_model(self, request, obj: Trigger, form, change: bool) -> None:
        relevant = set(COMMON_FIELDS) | KIND_FIELDS[obj.kind]
        data = {name: form.cleaned_data[name] for name in form.cleaned_data if name in relevant}
        data["workflow"] = data["workflow"].name if data.get("workflow") else None
        if change:
            changes = {name: data[name] for name in form.changed_data if name in data}
            trigger_update(trigger_id=obj.pk, actor=request.user, changes=changes)
            return
        trigger, secret = trigger_create(team=form.cleaned_data["team"], kind=obj.kind,
                                         actor=request.user, **data)
        obj.pk, obj._state.adding = trigger.pk, False
        request._stepwise_secret = (trigger, secret)

    def response_add(self, request, obj, post_url_continue=None):
        trigger, secret = getattr(request, "_stepwise_secret", (None, None))
        if secret:
            return self._secret_page(request, trigger, secret, "created")
        return super().response_add(request, obj, post_url_continue)

    def _secret_page(self, request, trigger: Trigger, secret: str, what: str):
        context = {**self.admin_site.each_context(request), "opts": self.model._meta,
                   "title": f"Webhook {trigger.name}: its secret", "trigger": trigger,
                   "secret": secret, "what": what,
                   "webhook_url": request.build_absolute_uri(
                       reverse("api:trigger-webhook", kwargs={"trigger_id": trigger.id})),
                   "change_url": reverse("admin:triggers_trigger_change", args=[trigger.id])}
        response = TemplateResponse(request, "triggers/secret_once.html", context)
        response["Cache-Control"] = "no-store"
        return response

    # --- actions ---------------------------------------------------------------------------

    @admin.action(description="Enable selected triggers", permissions=["manage"])
    def enable_selected(self, request, queryset: QuerySet[Trigger]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected triggers", permissions=["manage"])
    def disable_selected(self, request, queryset: QuerySet[Trigger]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request, queryset, enabled: bool) -> None:
        done = 0
        for trigger_id in queryset.values_list("id", flat=True):
            try:
                trigger_update(trigger_id=trigger_id, actor=request.user,
                               changes={"enabled": enabled})
                done += 1
            except ServiceError as exc:
                self.message_user(request, f"trigger {trigger_id}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{'Enabled' if enabled else 'Disabled'} {done} trigger(s).",
                              messages.SUCCESS)

    @admin.action(description="Rotate the webhook secret (shows the new one once)",
                  permissions=["manage"])
    def rotate_secret(self, request, queryset: QuerySet[Trigger]):
        if queryset.count() != 1:
            self.message_user(request, "Select one webhook trigger to rotate its secret.",
                              messages.ERROR)
            return None
        try:
            trigger, secret = webhook_secret_rotate(trigger_id=queryset.get().id, actor=request.user)
        except ServiceError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return None
        return self._secret_page(request, trigger, secret, "rotated")

    # --- what the page shows -----------------------------------------------------------------

    @admin.display(description="when")
    def when(self, trigger: Trigger) -> str:
        if trigger.kind != TriggerKind.SCHEDULE:
            return ""
        if trigger.cron:
            return f"{trigger.cron} ({trigger.timezone})"
        return f"every {trigger.interval_s} s"

    @admin.display(description="webhook URL")
    def webhook_url(self, trigger: Trigger) -> str:
        if trigger.kind != TriggerKind.WEBHOOK or not trigger.pk:
            return "-"
        return reverse("api:trigger-webhook", kwargs={"trigger_id": trigger.id})

    @admin.display(description="next slots")
    def next_slots(self, trigger: Trigger) -> str:
        """The saved schedule's next slots in its zone; schedule_preview.js shows those of the
        settings being edited here, before they are saved."""
        saved = Trigger.objects.filter(pk=trigger.pk).first() if trigger.pk else None
        slots = []
        if saved is not None and saved.kind == TriggerKind.SCHEDULE and saved.schedule_anchor:
            slots, _ = next_slots(schedule_of(saved), last_slot=saved.last_slot)
        return format_html(
            '<div id="schedule-preview" data-preview-url="{}">{}</div>',
            reverse("admin:triggers_trigger_preview_slots"),
            format_html("<ul>{}</ul>", format_html_join(
                "", '<li><time datetime="{}">{}</time></li>',
                ((slot["at"], slot["label"]) for slot in slots))) if slots else "-")

    def get_urls(self):
        preview = self.admin_site.admin_view(self.preview_slots)
        return [path("preview-slots/", preview, name="triggers_trigger_preview_slots"),
                *super().get_urls()]

    def preview_slots(self, request):
        """The next slots of the schedule in the query (cron or interval_s, timezone), as it
        would run if saved now; its problems instead when it has some."""
        query = request.GET
        interval = query.get("interval_s", "").strip()
        if interval and not interval.isdigit():
            return JsonResponse({"slots": [], "errors": [
                {"path": "interval_s", "message": "must be a whole number of seconds"}]})
        schedule = Schedule(query.get("cron", "")[:100], query.get("timezone", "UTC")[:64] or "UTC",
                            int(interval) if interval else None)
        slots, problems = next_slots(schedule)
        return JsonResponse({"slots": slots, "errors": problems})

    class Media:
        js = ["stepwise/schedule_preview.js"]

    @admin.display(description="recent firings")
    def recent_firings(self, trigger: Trigger) -> str:
        firings = list(trigger.firings.select_related("run", "coalesced_into").order_by("-created_at")[:20])
        if not firings:
            return "none yet"
        rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", (
            (f.created_at.strftime("%Y-%m-%d %H:%M:%S"), f.key, f.state,
             format_html('<a href="{}">{}</a>', reverse("admin:orchestrator_run_change",
                                                        args=[f.run_id]), f.run_id)
             if f.run_id else _why(f)) for f in firings))
        return format_html("<table><tr><th>fired</th><th>key</th><th>state</th>"
                           "<th>run, or why none</th></tr>{}</table>", rows)


def _why(firing: Firing) -> str:
    if firing.state == Firing.State.DEBOUNCING:
        return f"held until {firing.due_at:%H:%M:%S} UTC unless a newer event comes"
    if firing.state == Firing.State.COALESCED:
        newer = firing.coalesced_into
        return f"replaced by {newer.key}" + (f", which started run {newer.run_id}" if newer.run_id else "")
    if firing.state != Firing.State.REFUSED:
        return "-"
    said = "; ".join(f"{p.get('path')}: {p.get('message')}" if p.get("path") else p.get("message", "")
                     for p in firing.problems)
    return f"{firing.reason}: {said}" if said else firing.reason


@admin.register(Firing)
class FiringAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every firing, by key: at most one run each."""

    team_field = "trigger__team"
    list_display = ["created_at", "trigger", "key", badge_column("state"), "run", "reason",
                    "started_at"]
    list_filter = ["state", "reason", "trigger__kind"]
    list_select_related = ["trigger__team", "run"]
    search_fields = ["key", "trigger__name", "run__id"]
    fields = readonly_fields = ["trigger", "key", "state", "run", "reason", "problems_list",
                                "origin", "input", "fired_by", "created_at", "started_at"]

    @admin.display(description="problems")
    def problems_list(self, firing: Firing) -> str:
        return format_html_join("", "<p><code>{}</code> {}</p>",
                                ((p.get("path") or "-", p.get("message", "")) for p in firing.problems))


@admin.register(EventDeadLetter)
class EventDeadLetterAdmin(TeamScopedAdminMixin, ReadOnlyAdminMixin, admin.ModelAdmin):
    """Queue events that could not start a run. "Replay selected" calls the same service as the
    API, after the trigger (or the workflow) was fixed."""

    team_field = "trigger__team"
    list_display = ["id", "trigger", "key", "reason_class", badge_column("status"), "attempts",
                    "created_at", "run"]
    list_filter = ["status", "reason_class"]
    list_select_related = ["trigger__team", "run"]
    search_fields = ["key", "trigger__name", "body"]
    fields = readonly_fields = ["trigger", "key", "reason_class", "problems_list", "status",
                                "attempts", "body_pretty", "body_complete", "meta_pretty", "run",
                                "created_at", "replayed_at", "replayed_by"]
    actions = ["replay"]

    def has_replay_permission(self, request) -> bool:
        return teams_where(request.user, Action.DEAD_LETTER_REDRIVE).exists()

    @admin.display(description="problems")
    def problems_list(self, letter: EventDeadLetter) -> str:
        return format_html_join("", "<p><code>{}</code> {}</p>",
                                ((p.get("path") or "-", p.get("message", "")) for p in letter.problems))

    @admin.display(description="body")
    def body_pretty(self, letter: EventDeadLetter) -> str:
        return format_html('<pre class="stepwise-json">{}</pre>', letter.body)

    @admin.display(description="where it came from")
    def meta_pretty(self, letter: EventDeadLetter) -> str:
        return pretty_json(letter.meta)

    @admin.action(description="Replay selected", permissions=["replay"])
    def replay(self, request, queryset: QuerySet[EventDeadLetter]) -> None:
        for letter_id in queryset.values_list("id", flat=True):
            try:
                letter, outcome = event_dead_letter_replay(dead_letter_id=letter_id,
                                                           actor=request.user)
            except (NotAllowed, Forbidden) as exc:
                self.message_user(request, f"dead letter {letter_id}: {exc}", messages.ERROR)
                continue
            if outcome.accepted:
                self.message_user(request, f"dead letter {letter_id}: {outcome.status}"
                                  + (f", run {outcome.run.id}" if outcome.run else ""),
                                  messages.SUCCESS)
            else:
                reasons = "; ".join(p.get("message", "") for p in outcome.problems)
                self.message_user(request, f"dead letter {letter_id} still cannot start a run "
                                  f"({outcome.reason}): {reasons}", messages.WARNING)
