"""Creates or updates the provider's client and people from JSON on standard input (run in the
provider's settings by `Provider._seed`)."""
import json
import sys


def seed() -> None:
    from django.contrib.auth.models import Group, User
    from oauth2_provider.models import Application

    what = json.loads(sys.stdin.read())
    if client := what.get("client"):
        app = Application.objects.filter(client_id=client["client_id"]).first() or Application(
            client_id=client["client_id"], name="Stepwise",
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            algorithm=Application.RS256_ALGORITHM, skip_authorization=False)
        app.client_secret = client["client_secret"]
        app.redirect_uris = " ".join(client["redirect_uris"])
        app.save()
    if person := what.get("person"):
        user = User.objects.filter(username=person["username"]).first() or User(
            username=person["username"])
        user.email = person["email"]
        user.set_password(person["password"])
        user.save()
        user.groups.set([Group.objects.get_or_create(name=n)[0] for n in person["groups"]])
