"""Egress: every outbound call Stepwise makes goes where a policy allows, and ends in time.

The public API; import from here, not from the modules:

* `request(method, url, *, policy, deadline_s, ...)` (client.py) - the one outbound HTTP call:
  the destination checked before sending and on the resolved address actually connected to,
  redirects off or each hop re-checked, one deadline for the whole call, a response size cap.
* `policy_for(tool=, team=)` (policy.py) - the policy of a tool's (or any named caller's, e.g.
  `webhook`) calls for a team, from the STEPWISE_EGRESS setting; `policy_for_base_url(url)` -
  a URL an operator configured (a model provider's `base_url`) and only that.
* `url_problems`, `definition_checker` (static.py) - the check made when a definition is saved.
* `EgressRefused`, `ResponseTooLarge`, `as_step_error` (errors.py) - what a call raises and
  how a step classifies it.

Callers: the `http.request` tool (tools/builtin.py), the model providers
(providers/errors.py); a future webhook or callback sender calls
`request(..., policy=policy_for(tool="webhook", team=team.slug), deadline_s=...)`.
See docs/egress.md. This package never reads or writes the database.
"""

from django.core import checks

from .client import EgressResponse, request
from .errors import EgressRefused, ResponseTooLarge, as_step_error
from .policy import (
    DEFAULT_POLICY,
    Policy,
    config_problems,
    host_matches,
    policy_for,
    policy_for_base_url,
)
from .static import definition_checker, url_problems


@checks.register(checks.Tags.security)
def check_egress_setting(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """A malformed STEPWISE_EGRESS stops `manage.py check` (and so start-up), not a step."""
    return [checks.Error(problem, id="stepwise.egress.E001") for problem in config_problems()]


__all__ = [
    "DEFAULT_POLICY",
    "EgressRefused",
    "EgressResponse",
    "Policy",
    "ResponseTooLarge",
    "as_step_error",
    "definition_checker",
    "host_matches",
    "policy_for",
    "policy_for_base_url",
    "request",
    "url_problems",
]
