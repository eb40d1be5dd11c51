"""The REST API (/api/v1/): thin views over the services, scoped to the caller's teams.

Modules, one concern each:

* `parsers` - request body parsers (YAML definitions).
* `errors` - how every error becomes an HTTP response, in one shape.
* `permissions` - who sees what: team scoping and the approval decision check.
* `filters` - django-filter FilterSets for the list endpoints.
* `pagination` - keyset pages behind `?cursor=`, `?limit=` checked, with maxima.
* `serializers` - request shapes and response representations (no business logic).
* `views` - the endpoints; each parses the request, calls one service, serializes.
* `health` - liveness (anonymous), health details (operators) and the definition schema.
* `schema` - the errors every endpoint documents in the published OpenAPI schema.
* `urls` - the routes.
"""
