"""The mapping of the identity provider's groups (orchestrator/web/sso/mapping.py)."""
import pytest
from django.core.exceptions import ImproperlyConfigured

from orchestrator.web.sso.mapping import Access, access_for, groups_in, validate

MAPPING = {"a": {"team": "support", "role": "editor", "groups": ["x"]},
           "b": {"team": "support", "role": "member", "groups": ["y"], "staff": True},
           "c": {"team": "ops", "role": "owner"}, "d": {"auditor": True}}


def test_the_highest_role_per_team_and_the_union_of_groups_and_staff():
    assert access_for(["b", "a", "c", "zzz"], MAPPING) == Access(
        teams={"support": "editor", "ops": "owner"}, groups=frozenset({"x", "y"}), staff=True,
        known=True)


def test_an_auditor_is_in_the_auditors_group_and_staff():
    assert access_for(["d"], MAPPING) == Access(groups=frozenset({"auditors"}), staff=True,
                                                known=True)


def test_groups_the_mapping_does_not_name_grant_nothing():
    assert access_for(["zzz"], MAPPING) == Access()
    assert not access_for([], MAPPING).known


def test_the_groups_claim_may_be_a_list_or_one_name():
    assert groups_in({"groups": ["a", 3, "b"]}, "groups") == ["a", "b"]
    assert groups_in({"roles": "a"}, "roles") == ["a"]
    assert groups_in({}, "groups") == []


@pytest.mark.parametrize("mapping, message", [
    ([], "must be a JSON object"),
    ({"a": "support"}, "must be an object"),
    ({"a": {"team": "support", "rol": "owner"}}, "unknown keys: rol"),
    ({"a": {"role": "owner"}}, "has a role but no team"),
    ({"a": {"team": "support", "role": "admin"}}, "role must be one of"),
    ({"a": {"groups": "leads"}}, "groups must be a list"),
])
def test_a_wrong_mapping_is_refused_naming_the_entry(mapping, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        validate(mapping)
