"""Single sign-on through a real OpenID Connect provider (tests/support/oidc/): the code is
exchanged over HTTP, the ID token checked against the provider's keys, the groups read from its
userinfo; the mapping adds and removes what it granted, keeps what was granted locally, is
audited, and refuses whom it does not know."""
import json

import pytest
from django.contrib.auth.models import Group, User

from orchestrator.models import Role, SsoGrant, TeamMembership
from tests.factories import TeamFactory, member
from tests.support.ledger import ledger_before, new_entries  # noqa: F401 (the autouse fixture)
from tests.support.oidc import sign_in_at_provider

pytestmark = pytest.mark.django_db

MAPPING = {
    "idp-support": {"team": "support", "role": "member", "groups": ["support_leads"]},
    "idp-support-ops": {"team": "support", "role": "operator", "staff": True},
    "idp-audit": {"auditor": True},
}


@pytest.fixture
def sso(settings, oidc_provider, team):
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend",
                                        "orchestrator.web.sso.backends.StepwiseOIDCBackend"]
    for name, value in oidc_provider.settings().items():
        setattr(settings, name, value)
    settings.STEPWISE_OIDC_PROVIDER_NAME = "Example IdP"
    settings.STEPWISE_OIDC_GROUPS = MAPPING
    settings.OIDC_CREATE_USER = True
    settings.STEPWISE_OIDC_REFUSE_UNMAPPED = True
    return settings


def sign_in(client, provider, username, groups, *, password="idp-pass-1", allow=True):
    """Sign in through the provider as `username`, who is in `groups` there; the response of
    Stepwise's callback."""
    provider.person(username, password, groups=groups)
    start = client.get("/sso/authenticate/?next=/admin/")
    assert start.status_code == 302 and start["Location"].startswith(provider.url)
    back = sign_in_at_provider(start["Location"], username, password, allow=allow)
    assert back.startswith("http://testserver/sso/callback/?")
    return client.get(back.removeprefix("http://testserver"))


def signed_in_as(client) -> str | None:
    user_id = client.session.get("_auth_user_id")
    return User.objects.get(pk=user_id).username if user_id else None


def sso_ledger():
    return new_entries().filter(action="sso.access_changed")


def sso_entries(username):
    return [(e.outcome, json.loads(e.payload)) for e in sso_ledger().filter(
        subject_id=username).order_by("sequence", "id")]


def test_a_new_person_signs_in_and_gets_the_mapped_team_role_and_approver_group(
        client, oidc_provider, sso, team):
    done = sign_in(client, oidc_provider, "alice", ["idp-support", "idp-unrelated"])

    assert done.status_code == 302 and done["Location"] == "/admin/"
    assert signed_in_as(client) == "alice"
    alice = User.objects.get(username="alice")
    assert alice.email == "alice@example.com" and not alice.has_usable_password()
    assert TeamMembership.objects.get(user=alice, team=team).role == Role.MEMBER
    assert list(alice.groups.values_list("name", flat=True)) == ["support_leads"]
    assert not alice.is_staff
    assert sso_entries("alice") == [("created", {
        "idp_groups": ["idp-support", "idp-unrelated"],
        "added": ["team support as member", "group support_leads"], "removed": [],
        "changed": []})]
    entry = sso_ledger().get()
    assert (entry.actor, entry.actor_kind, entry.subject_type) == ("service:sso", "service", "user")
    # A reviewer in an approver group may enter the admin to decide.
    assert client.get("/admin/").status_code == 200


def test_each_sign_in_adds_and_removes_what_the_mapping_granted_and_keeps_local_grants(
        client, oidc_provider, sso, team):
    billing = TeamFactory(slug="billing", name="Billing")
    bob = member(billing, "bob", role=Role.OWNER, groups=("finance_approvers",))
    assert not bob.is_staff

    sign_in(client, oidc_provider, "bob", ["idp-support", "idp-support-ops"])
    bob.refresh_from_db()
    assert TeamMembership.objects.get(user=bob, team=team).role == Role.OPERATOR  # the highest
    assert set(bob.groups.values_list("name", flat=True)) == {"finance_approvers", "support_leads"}
    assert bob.is_staff

    client.logout()
    sign_in(client, oidc_provider, "bob", ["idp-support"])
    bob.refresh_from_db()
    assert TeamMembership.objects.get(user=bob, team=team).role == Role.MEMBER
    assert not bob.is_staff

    client.logout()
    sign_in(client, oidc_provider, "bob", ["idp-audit"])
    bob.refresh_from_db()
    assert not TeamMembership.objects.filter(user=bob, team=team).exists()
    assert set(bob.groups.values_list("name", flat=True)) == {"finance_approvers", "auditors"}
    assert bob.is_staff
    # What was granted in the admin stays through every sign-in.
    assert TeamMembership.objects.get(user=bob, team=billing).role == Role.OWNER

    client.logout()
    sign_in(client, oidc_provider, "bob", ["idp-audit"])  # nothing changes: nothing recorded
    assert signed_in_as(client) == "bob"

    assert [(outcome, p["added"], p["removed"], p["changed"])
            for outcome, p in sso_entries("bob")] == [
        ("changed", ["team support as operator", "group support_leads", "staff"], [], []),
        ("changed", [], ["staff"], ["team support: operator to member"]),
        ("changed", ["group auditors", "staff"], ["team support", "group support_leads"], []),
    ]
    assert set(SsoGrant.objects.filter(user=bob).values_list("kind", "name")) == {
        ("group", "auditors"), ("staff", "")}


def test_a_local_membership_is_not_taken_over_by_the_mapping(client, oidc_provider, sso, team):
    carol = member(team, "carol", role=Role.OWNER, groups=("support_leads",))
    sign_in(client, oidc_provider, "carol", ["idp-support"])
    client.logout()
    sign_in(client, oidc_provider, "carol", ["idp-audit"])
    assert TeamMembership.objects.get(user=carol, team=team).role == Role.OWNER
    assert "support_leads" in carol.groups.values_list("name", flat=True)
    assert not SsoGrant.objects.filter(user=carol, kind="team").exists()


def test_a_person_in_no_mapped_group_is_refused_with_a_page_that_says_why(
        client, oidc_provider, sso):
    done = sign_in(client, oidc_provider, "mallory", ["idp-marketing"])

    assert done.status_code == 302 and done["Location"] == "/sso/refused/"
    page = client.get("/sso/refused/")
    assert page.status_code == 403
    assert ("None of your groups at the identity provider (idp-marketing) gives access to "
            "Stepwise.") in page.content.decode()
    assert signed_in_as(client) is None
    assert not User.objects.filter(username="mallory").exists()
    assert not sso_ledger().exists()


def test_a_person_in_no_mapped_group_signs_in_when_refusal_is_off(client, oidc_provider, sso):
    sso.STEPWISE_OIDC_REFUSE_UNMAPPED = False
    sign_in(client, oidc_provider, "dave", ["idp-marketing"])
    assert signed_in_as(client) == "dave"
    assert not TeamMembership.objects.filter(user__username="dave").exists()


def test_an_unknown_person_is_refused_unless_accounts_are_created_at_sign_in(
        client, oidc_provider, sso, team):
    sso.OIDC_CREATE_USER = False
    done = sign_in(client, oidc_provider, "erin", ["idp-support"])
    assert done["Location"] == "/sso/refused/"
    assert ("There is no Stepwise account named &#x27;erin&#x27;, and accounts are not created "
            "at sign-in here.") in client.get("/sso/refused/").content.decode()
    assert not User.objects.filter(username="erin").exists()

    member(TeamFactory(slug="billing"), "erin", role=Role.MEMBER)
    sign_in(client, oidc_provider, "erin", ["idp-support"])
    assert signed_in_as(client) == "erin"
    assert Group.objects.get(name="support_leads").user_set.filter(username="erin").exists()


def test_the_login_page_offers_the_provider_beside_the_local_form(client, sso):
    page = client.get("/admin/login/?next=/admin/").content.decode()
    assert 'href="/sso/authenticate/?next=/admin/"' in page
    assert "Sign in with Example IdP" in page
    assert 'id="login-form"' in page


def test_single_sign_on_is_off_unless_configured_and_local_accounts_sign_in(client, team):
    page = client.get("/admin/login/").content.decode()
    assert "Sign in with" not in page
    assert client.get("/sso/authenticate/").status_code == 404
    assert client.get("/sso/callback/?code=x&state=y").status_code == 404
    local = member(team, "frank", role=Role.MEMBER, staff=True)
    local.set_password("local-pass-1")
    local.save()
    done = client.post("/admin/login/?next=/admin/",
                       {"username": "frank", "password": "local-pass-1", "next": "/admin/"})
    assert done.status_code == 302 and done["Location"] == "/admin/"
    assert signed_in_as(client) == "frank"


def test_a_wrong_mapping_refuses_sign_in_and_leaves_local_accounts_alone(
        client, oidc_provider, sso, team):
    sso.STEPWISE_OIDC_GROUPS = {"idp-support": {"team": "support", "role": "admin"}}
    done = sign_in(client, oidc_provider, "gina", ["idp-support"])
    assert done["Location"] == "/sso/refused/"
    assert "Single sign-on is not configured correctly here (its group mapping)" in (
        client.get("/sso/refused/").content.decode())
    assert not User.objects.filter(username="gina").exists()
    local = member(team, "hank", role=Role.MEMBER, staff=True)
    local.set_password("local-pass-1")
    local.save()
    client.post("/admin/login/", {"username": "hank", "password": "local-pass-1",
                                  "next": "/admin/"})
    assert signed_in_as(client) == "hank"


def test_a_person_who_cancels_at_the_provider_is_not_signed_in(client, oidc_provider, sso):
    done = sign_in(client, oidc_provider, "ivan", ["idp-support"], allow=False)
    assert done["Location"] == "/sso/refused/"
    assert "The identity provider did not sign you in" in client.get("/sso/refused/").content.decode()
    assert signed_in_as(client) is None
    assert not User.objects.filter(username="ivan").exists()


def test_an_id_token_from_another_issuer_signs_nobody_in(client, oidc_provider, sso):
    sso.STEPWISE_OIDC_ISSUER = "https://idp.example.com"
    done = sign_in(client, oidc_provider, "judy", ["idp-support"])
    assert done.status_code == 400
    assert signed_in_as(client) is None
    assert not User.objects.filter(username="judy").exists()

