"""Model prices as records through the API (/api/v1/model-prices/): effective-dated, recorded
through `model_price_create` (superusers only, audited), and never rewriting what a past call
cost. The calls are made to a real local HTTP server speaking the OpenAI API."""
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from budgets.models import ModelPrice
from orchestrator.models import Role, Run, StepAttempt
from tests.conftest import client_for
from tests.factories import member
from tests.support.fake_llm import reply

from .conftest import CALL, classify_run, execute

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("priced_model")]
PRICES = "/api/v1/model-prices/"


@pytest.fixture
def admin_api(team):
    user = member(team, "root", role=Role.OWNER, staff=True)
    user.is_superuser = True
    user.save()
    return client_for(user)


@pytest.fixture
def owner(team):
    return member(team, "owner", role=Role.OWNER)


def test_a_superuser_records_a_price_which_is_audited_and_listed_to_any_member(team, admin_api):
    response = admin_api.post(PRICES, {"model": "gpt", "input_usd_per_mtok": "1.5",
                                       "output_usd_per_mtok": "6", "effective_from": "2026-11-01T00:00:00Z"},
                              format="json")

    assert response.status_code == 201, response.json()
    created = response.json()
    assert (created["model"], created["input_usd_per_mtok"], created["output_usd_per_mtok"],
            created["effective_from"]) == ("gpt", "1.500000", "6.000000", "2026-11-01T00:00:00Z")
    entry = AuditEntry.objects.get(action="budget.price_created")
    assert (entry.subject_type, entry.subject_id, entry.actor) == ("model_price", str(created["id"]), "user:root")
    assert entry.data == {"model": "gpt", "input_usd_per_mtok": "1.500000", "output_usd_per_mtok": "6.000000",
                          "effective_from": "2026-11-01T00:00:00+00:00"}
    listed = client_for(member(team, "reader", role=Role.MEMBER)).get(PRICES, {"model": "gpt"})
    assert [row["id"] for row in listed.json()["results"]] == [created["id"]]
    assert client_for(member(team, "r2", role=Role.MEMBER)).get(PRICES, {"model": "fast"}).json()["results"] == []


def test_only_a_superuser_records_a_price(team, owner):
    response = client_for(owner).post(PRICES, {"model": "gpt", "input_usd_per_mtok": "1",
                                               "output_usd_per_mtok": "1"}, format="json")

    assert response.status_code == 403
    assert response.json()["errors"][0]["message"] == "only a superuser sets model prices"
    assert not ModelPrice.objects.exists()
    assert not AuditEntry.objects.filter(action="budget.price_created").exists()


@pytest.mark.parametrize("body, path", [
    ({"model": "nope", "input_usd_per_mtok": "1", "output_usd_per_mtok": "1"}, "model"),
    ({"model": "gpt", "input_usd_per_mtok": "-1", "output_usd_per_mtok": "1"}, "input_usd_per_mtok"),
    ({"model": "gpt", "input_usd_per_mtok": "1"}, "output_usd_per_mtok"),
    ({"model": "gpt", "input_usd_per_mtok": "1", "output_usd_per_mtok": "1",
      "effective_from": "2026-01-01T00:00:00Z"}, ""),  # a price of gpt from that moment exists
])
def test_a_price_the_service_cannot_record_is_a_400_naming_it(team, admin_api, body, path):
    ModelPrice.objects.create(model="gpt", input_usd_per_mtok=1, output_usd_per_mtok=1,
                              effective_from=datetime(2026, 1, 1, tzinfo=UTC))

    response = admin_api.post(PRICES, body, format="json")

    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == [path]
    assert ModelPrice.objects.count() == 1


def test_a_new_price_never_rewrites_what_past_calls_cost(team, admin_api, fake_llm):
    fake_llm.default = reply({"category": "billing"})
    before = classify_run(team, budget=None)
    execute(before)  # at the registry's price: $0.07
    report = admin_api.get("/api/v1/costs/", {"group_by": "run"}).json()

    response = admin_api.post(PRICES, {"model": "gpt", "input_usd_per_mtok": "0",
                                       "output_usd_per_mtok": "20000"}, format="json")
    assert response.status_code == 201

    assert Run.objects.get(pk=before.pk).cost_usd == CALL
    assert StepAttempt.objects.get(step__run=before).cost_usd == CALL
    assert admin_api.get("/api/v1/costs/", {"group_by": "run"}).json() == report
    after = classify_run(team, budget=None)
    execute(after)  # priced when it runs: at the new price
    assert Run.objects.get(pk=after.pk).cost_usd == 2 * CALL
    assert StepAttempt.objects.get(step__run=before).cost_usd == CALL
    costs = {row["group"]: Decimal(row["cost_usd"])
             for row in admin_api.get("/api/v1/costs/", {"group_by": "run"}).json()["rows"]}
    assert costs == {str(before.id): CALL, str(after.id): 2 * CALL}
