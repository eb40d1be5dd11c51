"""What the identity provider's groups grant in Stepwise, from STEPWISE_OIDC_GROUPS.

The mapping is a JSON object keyed by the provider's group names:

    {"idp-support": {"team": "support", "role": "member", "groups": ["support_leads"],
                     "staff": false, "auditor": false}}

Every key of an entry is optional. A person in several mapped groups gets the union: the highest
role per team, every group, staff if any entry says so. `auditor` is the `auditors` group and
staff (the ledger is read in the admin, which lets staff in). Pure: no database, no settings.
"""
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured

from audit.access import AUDITORS_GROUP
from orchestrator.models import Role

#: Roles from least to most: the highest a person's groups give wins.
ROLE_RANK = {Role.MEMBER: 0, Role.EDITOR: 1, Role.OPERATOR: 2, Role.OWNER: 3}
ENTRY_KEYS = frozenset({"team", "role", "groups", "staff", "auditor"})


@dataclass(frozen=True)
class Access:
    """What sign-in grants: {team slug: role}, group names, staff; `known` is False when none
    of the person's groups is in the mapping."""

    teams: dict[str, str] = field(default_factory=dict)
    groups: frozenset[str] = frozenset()
    staff: bool = False
    known: bool = False


def validate(mapping: object) -> dict[str, dict]:
    """The mapping, checked. Raises ImproperlyConfigured naming the first wrong entry."""
    if not isinstance(mapping, Mapping):
        raise ImproperlyConfigured("STEPWISE_OIDC_GROUPS must be a JSON object")
    for name, entry in mapping.items():
        if not isinstance(entry, Mapping):
            raise ImproperlyConfigured(f"STEPWISE_OIDC_GROUPS[{name!r}] must be an object")
        unknown = set(entry) - ENTRY_KEYS
        if unknown:
            raise ImproperlyConfigured(
                f"STEPWISE_OIDC_GROUPS[{name!r}] has unknown keys: {', '.join(sorted(unknown))}")
        if "role" in entry and "team" not in entry:
            raise ImproperlyConfigured(f"STEPWISE_OIDC_GROUPS[{name!r}] has a role but no team")
        if entry.get("role", Role.MEMBER) not in ROLE_RANK:
            raise ImproperlyConfigured(
                f"STEPWISE_OIDC_GROUPS[{name!r}]: role must be one of {', '.join(Role.values)}")
        groups = entry.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise ImproperlyConfigured(
                f"STEPWISE_OIDC_GROUPS[{name!r}]: groups must be a list of group names")
    return dict(mapping)


def access_for(idp_groups: Iterable[str], mapping: Mapping[str, Mapping]) -> Access:
    teams: dict[str, str] = {}
    groups: set[str] = set()
    staff = known = False
    for name in idp_groups:
        entry = mapping.get(name)
        if entry is None:
            continue
        known = True
        if "team" in entry:
            role = entry.get("role", Role.MEMBER)
            held = teams.get(entry["team"])
            if held is None or ROLE_RANK[role] > ROLE_RANK[held]:
                teams[entry["team"]] = role
        groups.update(entry.get("groups", []))
        if entry.get("auditor"):
            groups.add(AUDITORS_GROUP)
        staff = staff or bool(entry.get("staff")) or bool(entry.get("auditor"))
    return Access(teams=teams, groups=frozenset(groups), staff=staff, known=known)


def groups_in(claims: Mapping, claim: str) -> list[str]:
    """The group names a claim holds: a list of names, or one name, or none."""
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []
