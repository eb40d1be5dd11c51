"""Single sign-on with OpenID Connect (docs/operations.md#single-sign-on).

- `mapping` reads STEPWISE_OIDC_GROUPS and says what a list of the identity provider's groups
  grants: team roles, Django groups (approver groups, `auditors`) and the staff flag.
- `services.sso_sign_in` is the one state change: it creates the account when allowed and
  applies that access, adding and removing only what single sign-on granted before
  (`orchestrator.models.SsoGrant`), with a ledger entry when anything changed.
- `backends` is mozilla-django-oidc's backend told where the username and groups are and when
  to refuse; `views` are its login and callback views, answering 404 while SSO is off, and the
  page that says why a sign-in was refused.

Off unless STEPWISE_OIDC_CLIENT_ID is set; the admin's username and password form stays.
"""
