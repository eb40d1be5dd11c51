from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """Adds the person's username, e-mail and groups (their Django groups here) to the ID token
    and the userinfo answer, as an identity provider with a groups claim does."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "groups"}

    def get_additional_claims(self, request):
        user = request.user
        return {"preferred_username": user.username, "email": user.email,
                "name": user.get_full_name() or user.username,
                "groups": sorted(user.groups.values_list("name", flat=True))}
