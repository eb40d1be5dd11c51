"""The sample datasets: the refund example's 30 cases in three tiers, the content-moderation
template's cases given to a workflow made from it, and both loaded by `make run`'s bootstrap."""
import io

import pytest
from django.core.management import call_command

from evaluation.models import Dataset
from orchestrator.engine.services.gallery import template_instantiate

from .conftest import sample_cases

pytestmark = pytest.mark.django_db


def test_the_refund_sample_has_thirty_cases_in_three_tiers_a_third_high_or_more():
    cases = sample_cases("refund-proposal")
    tiers = [c["risk_tier"] for c in cases]
    assert len(cases) == 30 and set(tiers) == {"low", "medium", "high"}
    assert tiers.count("high") * 3 >= len(cases)


def test_a_workflow_from_the_content_moderation_template_gets_its_sample_dataset(team, editor):
    version, _ = template_instantiate(template="content-moderation", team=team, actor=editor, name="moderation")
    dataset = Dataset.objects.get(workflow=version.workflow, name="sample")
    assert dataset.latest_version.case_count == len(sample_cases("content-moderation"))
    assert dataset.latest_version.tier_counts["high"] >= 1
    template_instantiate(template="content-moderation", team=team, actor=editor, name="moderation")
    assert Dataset.objects.filter(workflow=version.workflow).count() == 1
    assert dataset.versions.count() == 2


def test_a_template_without_samples_gets_no_dataset(team, editor):
    version, _ = template_instantiate(template="support-reply", team=team, actor=editor)
    assert not Dataset.objects.filter(workflow=version.workflow).exists()


def test_the_bootstrap_loads_the_sample_datasets_once(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("stepwise_bootstrap", stdout=io.StringIO())
    call_command("stepwise_bootstrap", stdout=io.StringIO())
    loaded = {d.workflow.name: d.latest_version.case_count for d in Dataset.objects.filter(team__slug="demo")}
    assert loaded == {"refund-proposal": 30, "content-moderation": 11}



def test_the_content_moderation_template_ships_a_gate_its_own_version_passes(team, editor):
    from evaluation.evaluations import evaluation_start
    from evaluation.gate import release_problems
    from evaluation.models import ReleasePolicy
    from orchestrator.engine.errors import Forbidden
    from orchestrator.engine.gallery import template_named
    from orchestrator.engine.services.workflows import (
        workflow_policy_set,
        workflow_publish,
        workflow_save,
    )
    from tests.factories import SETUP

    from .test_evaluations import drive

    version, _ = template_instantiate(template="content-moderation", team=team, actor=editor, name="moderation")
    workflow = version.workflow
    policy = ReleasePolicy.objects.get(workflow=workflow)
    assert policy.dataset.name == "sample" and policy.thresholds == template_named("content-moderation").release_policy
    workflow.refresh_from_db()
    assert workflow.active_version == version  # the first version is published: nothing to compare with yet

    workflow_policy_set(workflow_id=workflow.id, publish_on_save=False, actor=SETUP)
    changed = {**version.definition, "description": "Tighter wording."}
    draft, _ = workflow_save(team=team, definition=changed, actor=editor)
    with pytest.raises(Forbidden):
        workflow_publish(workflow_id=workflow.id, number=draft.number, actor=editor)
    for number in (version.number, draft.number):  # the published one too: the policy limits regression
        done = drive(evaluation_start(dataset=policy.dataset, version=number, actor=editor, budget_usd=1,
                                      concurrency=11))
        assert done.state == "completed" and done.cases.filter(passed=True).count() == 11
    assert release_problems(workflow=workflow, version=draft) == []
    workflow_publish(workflow_id=workflow.id, number=draft.number, actor=editor)
