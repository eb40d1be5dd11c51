"""Which schemathesis phases the API fuzzer runs for each caller (tests/api/test_openapi_fuzz.py):
the coverage phase for the callers STEPWISE_FUZZ_COVERAGE names, every other phase for all."""
import pytest

from tests.api.test_openapi_fuzz import phases

EVERY = ["examples", "coverage", "fuzzing", "stateful"]
WITHOUT_COVERAGE = ["examples", "fuzzing", "stateful"]


def test_make_tests_short_form_sends_the_coverage_phase_as_the_owner_only():
    assert phases("owner", "owner") == EVERY
    assert phases("editor", "owner") == WITHOUT_COVERAGE
    assert phases("member", "owner") == WITHOUT_COVERAGE


def test_all_sends_the_coverage_phase_as_every_caller():
    assert [phases(caller, "all") for caller in ("owner", "editor", "member")] == [EVERY] * 3
    assert phases("member", "editor,member") == EVERY
    assert phases("owner", "editor,member") == WITHOUT_COVERAGE


def test_a_caller_that_does_not_exist_is_refused_by_name():
    with pytest.raises(ValueError, match="no caller \\['admin'\\]"):
        phases("owner", "owner,admin")
