"""Logical models and their ordered routes: what the model registry says serves a model name.

A registry entry is either one provider entry (one route) or `{"routes": [entry, ...]}`, each
route a full provider entry (`provider`, `model_id`, `base_url`, prices, `timeout_s`, ...) and
optionally a `name`. The agent executor tries the routes in order (`executors.agent`); this
module only reads the registry and says what a route is called, what its breaker is keyed by,
what it is priced under and whether a team may call it. It calls nothing.
"""
from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlsplit

from django.conf import settings

from ..egress import host_matches, policy_for
from .base import Provider

# The caller name model routes are checked under in a team's egress layer (STEPWISE_EGRESS
# `teams.<team>` and `teams.<team>.tools.model`).
EGRESS_CALLER = "model"


@dataclass(frozen=True)
class Route:
    model: str  # the logical model (registry name)
    index: int  # its place in the model's order, from 0
    name: str
    config: dict
    provider: Provider
    routed: bool  # the entry lists `routes` (else it is a plain single entry)

    @property
    def dependency(self) -> str:
        """The key of this route's breaker (engine.limits): shared by every worker."""
        return f"route:{self.model}:{self.name}"

    @property
    def price_model(self) -> str:
        """The model whose `ModelPrice` rows price this route's calls: the model of a plain
        entry; none for a route of a routed one, which is priced at its own registry prices
        (a call costs what the route that answered charges, not what the model is listed at)."""
        return "" if self.routed else self.model

    @property
    def model_id(self) -> str:
        return self.config.get("model_id", self.model)

    @property
    def host(self) -> str:
        url = str(self.config.get("base_url") or self.provider.default_base_url)
        return (urlsplit(url).hostname or "").lower()

    def prices(self) -> tuple[Decimal, Decimal]:
        """(input, output) USD per million tokens, as the registry states them."""
        return (Decimal(str(self.config.get("input_usd_per_mtok", 0))),
                Decimal(str(self.config.get("output_usd_per_mtok", 0))))


def route_entries(entry: dict) -> list[dict]:
    """The route entries of a registry entry: its `routes`, or the entry itself."""
    routes = entry.get("routes")
    return list(routes) if isinstance(routes, list) else [entry]


def route_name(entry: dict) -> str:
    """A route's `name`, else `<provider>:<model_id>@<host>` (stable when routes are reordered)."""
    if entry.get("name"):
        return str(entry["name"])
    host = urlsplit(str(entry.get("base_url") or "")).hostname or "default"
    return f"{entry.get('provider')}:{entry.get('model_id', '')}@{host}"


def routes_for(model: str, providers: dict[str, type[Provider]]) -> list[Route]:
    """The routes of `model`, in order. Raises KeyError if the model or a provider is unknown."""
    entry = settings.STEPWISE_MODELS[model]
    routed = isinstance(entry.get("routes"), list)
    entries = route_entries(entry)
    if not entries:
        raise KeyError(model)
    return [Route(model, i, route_name(config), config, providers[config["provider"]](config), routed)
            for i, config in enumerate(entries)]


def registry_problems(registry: dict, providers: dict[str, type[Provider]]) -> list[str]:
    """Every entry of the model registry that cannot serve a call, by path: a route without a
    known provider, a `routes` that is not a non-empty list of objects, two routes of a model
    with one name (they would share a breaker)."""
    problems = []
    for model, entry in registry.items():
        if not isinstance(entry, dict):
            problems.append(f"STEPWISE_MODELS.{model}: must be an object")
            continue
        routes = entry.get("routes", entry)
        if "routes" in entry and (not isinstance(routes, list) or not routes):
            problems.append(f"STEPWISE_MODELS.{model}.routes: must be a non-empty list of routes")
            continue
        entries = routes if isinstance(routes, list) else [routes]
        names: set[str] = set()
        for i, config in enumerate(entries):
            where = f"STEPWISE_MODELS.{model}.routes[{i}]" if "routes" in entry else f"STEPWISE_MODELS.{model}"
            if not isinstance(config, dict):
                problems.append(f"{where}: must be an object")
                continue
            if config.get("provider") not in providers:
                problems.append(f"{where}.provider: {config.get('provider')!r} is not one of "
                                f"{', '.join(sorted(providers))}")
            name = route_name(config)
            if name in names:
                problems.append(f"{where}: a second route named {name!r}; give each a `name`")
            names.add(name)
    return problems


def route_dependencies(registry: dict) -> list[dict]:
    """Every route of a routed model in `registry`, in order, with its breaker key (for the
    operations page): model, route, provider, model_id, dependency."""
    return [{"model": model, "route": route_name(config), "provider": config.get("provider", ""),
             "model_id": config.get("model_id", model),
             "dependency": f"route:{model}:{route_name(config)}"}
            for model, entry in registry.items() if isinstance(entry.get("routes"), list)
            for config in entry["routes"]]


def egress_refusal(route: Route, team: str) -> str:
    """Why `team`'s egress policy forbids `route` ("" when it may be called).

    Only a team's own layer is consulted (STEPWISE_EGRESS `teams.<team>`, with its
    `tools.model`): the base URL itself is the operator's allowance for everyone, and a team
    narrows it by host (`hosts`, `deny_hosts`). Scheme, port and address checks stay the base
    URL's (errors.post_json).
    """
    teams = (getattr(settings, "STEPWISE_EGRESS", None) or {}).get("teams") or {}
    if not team or team not in teams or not route.host:
        return ""
    policy = policy_for(tool=EGRESS_CALLER, team=team)
    if host_matches(route.host, policy.deny_hosts):
        return f"team {team}'s egress policy refuses the host {route.host!r} (deny_hosts)"
    if not host_matches(route.host, policy.hosts):
        return f"team {team}'s egress policy does not allow the host {route.host!r}"
    return ""
