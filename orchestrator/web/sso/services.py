"""`sso_sign_in`: the account and the access a sign-in through the identity provider gives.

Only what single sign-on granted before (`SsoGrant`) is changed or removed; a membership, a
group or the staff flag given in the admin stays, and the mapping does not take it over. The
change and its ledger entry are one transaction.
"""
import logging

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from audit.services import audit_record
from orchestrator.models import SsoGrant, Team, TeamMembership

from .mapping import Access

logger = logging.getLogger(__name__)

#: Who the ledger says changed a person's access: the identity provider, through sign-in.
ACTOR = "service:sso"
Kind = SsoGrant.Kind


def sso_sign_in(*, username: str, email: str, idp_groups: list[str], access: Access,
                create: bool):
    """The user named `username` with `access` applied, created first when `create`; None
    when there is no such user and `create` is False. Writes a ledger entry
    (`sso.access_changed`) when the account was created or its access changed."""
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().filter(username=username).first()
        created = user is None
        if created:
            if not create:
                return None
            user = User(username=username, email=email)
            user.set_unusable_password()
            user.save()
        changes = _apply(user, access)
        if created or any(changes.values()):
            audit_record(action="sso.access_changed", actor=ACTOR, subject_type="user",
                         subject_id=username, outcome="created" if created else "changed",
                         payload={"idp_groups": sorted(idp_groups), **changes})
    return user


def _apply(user, access: Access) -> dict[str, list[str]]:
    added, removed, changed = [], [], []
    grants = {(g.kind, g.name): g for g in SsoGrant.objects.filter(user=user)}

    memberships = {m.team.slug: m for m in
                   TeamMembership.objects.filter(user=user).select_related("team")}
    teams = {t.slug: t for t in Team.objects.filter(slug__in=list(access.teams))}
    for slug, role in sorted(access.teams.items()):
        membership = memberships.get(slug)
        if slug not in teams:
            logger.warning("STEPWISE_OIDC_GROUPS names team %r, which does not exist", slug)
        elif membership is None:
            TeamMembership.objects.create(team=teams[slug], user=user, role=role)
            grants[(Kind.TEAM, slug)] = SsoGrant.objects.create(user=user, kind=Kind.TEAM,
                                                                name=slug)
            added.append(f"team {slug} as {role}")
        elif (Kind.TEAM, slug) in grants and membership.role != role:
            changed.append(f"team {slug}: {membership.role} to {role}")
            membership.role = role
            membership.save(update_fields=["role"])
    for kind, slug in [key for key in grants if key[0] == Kind.TEAM]:
        if slug not in access.teams or slug not in teams:
            TeamMembership.objects.filter(user=user, team__slug=slug).delete()
            grants.pop((kind, slug)).delete()
            removed.append(f"team {slug}")

    held = set(user.groups.values_list("name", flat=True))
    for name in sorted(access.groups - held):
        user.groups.add(Group.objects.get_or_create(name=name)[0])
        grants[(Kind.GROUP, name)] = SsoGrant.objects.create(user=user, kind=Kind.GROUP, name=name)
        added.append(f"group {name}")
    for kind, name in sorted(key for key in grants if key[0] == Kind.GROUP):
        if name not in access.groups:
            user.groups.remove(*Group.objects.filter(name=name))
            grants.pop((kind, name)).delete()
            removed.append(f"group {name}")

    if access.staff and not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        SsoGrant.objects.create(user=user, kind=Kind.STAFF, name="")
        added.append("staff")
    elif not access.staff and (Kind.STAFF, "") in grants:
        user.is_staff = False
        user.save(update_fields=["is_staff"])
        grants.pop((Kind.STAFF, "")).delete()
        removed.append("staff")
    return {"added": added, "removed": removed, "changed": changed}
