"""Secret run inputs: kept sealed, shown as a marker, revealed to a step only while it runs.

A value of a run's input is secret when its input schema marks it `writeOnly: true` (JSON
Schema's "may be sent, never returned back"), or when its key names a secret by the ledger's
redaction rules (`audit.redaction.is_secret_key`: password, token, api_key, authorization...).
`run_start` replaces each such value in the stored input by the marker `{"secret":
"input.<path>"}` and seals the values in a `RunSecret` row (`sealing.RUN_SECRETS`: the one
encryption path, under STEPWISE_TRIGGER_KEY). So the run's input, every step's input, the API,
the admin, events and the ledger only ever hold the marker.

A worker `reveal`s the markers in a step's input just before the executor renders templates and
calls the tool, in memory, and `scrub`s whatever comes back (output, effect result, error
message, the ledger's record of the call) so that a value echoed back is stored as `MASK`.

Reads and writes `RunSecret` only; decides nothing about runs; never logs a value.
"""
from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field

from audit.redaction import MIN_SCRUB_LENGTH, is_secret_key
from orchestrator.models import Run, RunSecret
from orchestrator.operations.logcontext import mask_in_logs

from .sealing import RUN_SECRETS

MASK = "••••"
MARKER_KEY = "secret"
Path = tuple[str, ...]


def _schema_paths(schema: object, value: object, path: Path) -> Iterator[Path]:
    if not isinstance(schema, dict):
        return
    if schema.get("writeOnly") is True:
        yield path
        return
    if isinstance(value, dict):
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            yield from _schema_paths(properties.get(key, extra), item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _schema_paths(schema.get("items"), item, (*path, str(index)))


def _named_paths(value: object, path: Path, known: Collection[str]) -> Iterator[Path]:
    if isinstance(value, dict):
        for key, item in value.items():
            if is_secret_key(str(key)):
                yield (*path, str(key))
            else:
                yield from _named_paths(item, (*path, str(key)), known)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _named_paths(item, (*path, str(index)), known)
    elif isinstance(value, str) and value in known:
        yield path


def secret_paths(schema: dict, value: object, *, known: Collection[str] = ()) -> list[Path]:
    """The paths of `value` (a run input) that hold secrets: marked `writeOnly` in `schema`,
    under a key that names a secret, or (`known`) equal to a secret the caller already holds."""
    found = dict.fromkeys([*_schema_paths(schema, value, ()), *_named_paths(value, (), known)])
    # A secret inside another is covered by the outer one.
    return [p for p in found if not any(p[:len(q)] == q and p != q for q in found)]


def marker(path: Path) -> dict:
    return {MARKER_KEY: ".".join(("input", *path))}


def split(schema: dict, value: dict, *, known: Collection[str] = ()) -> tuple[dict, dict]:
    """(`value` with a marker in place of each secret, {marker reference: the secret})."""
    secrets: dict[str, object] = {}
    masked = json.loads(json.dumps(value))
    for path in secret_paths(schema, value, known=known):
        node = masked
        for part in path[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = int(path[-1]) if isinstance(node, list) else path[-1]
        secrets[marker(path)[MARKER_KEY]] = node[last]
        node[last] = marker(path)
    if secrets:
        mask_in_logs(Revealed(secrets).known_for_logs())
    return masked, secrets


def seal_for(run: Run, secrets: dict) -> None:
    """Store a new run's secrets, sealed, in the caller's transaction."""
    if secrets:
        RunSecret.objects.create(run=run, sealed=RUN_SECRETS.seal(json.dumps(secrets)))


def _leaves(value: object) -> Iterator[object]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif value is not None and not isinstance(value, bool):
        yield value


@dataclass(frozen=True)
class Revealed:
    """A run's secrets in memory: `reveal` puts them in place of their markers, `scrub` masks
    them wherever they appear. Empty for a run without secrets (both return data unchanged)."""

    values: dict = field(default_factory=dict)

    @property
    def strings(self) -> list[str]:
        found = {str(leaf) for value in self.values.values() for leaf in _leaves(value)}
        return sorted(found, key=len, reverse=True)  # longest first: no partial masks left

    def known(self) -> list[str]:
        return [s for s in self.strings if s]

    def known_for_logs(self) -> list[str]:
        """The values long enough to be searched for in a log line (MIN_SCRUB_LENGTH)."""
        return [s for s in self.strings if len(s) >= MIN_SCRUB_LENGTH]

    def reveal(self, data: object) -> object:
        if not self.values:
            return data
        if isinstance(data, dict):
            if set(data) == {MARKER_KEY} and data[MARKER_KEY] in self.values:
                return self.values[data[MARKER_KEY]]
            return {key: self.reveal(item) for key, item in data.items()}
        if isinstance(data, list):
            return [self.reveal(item) for item in data]
        return data

    def scrub(self, data: object) -> object:
        if not self.values:
            return data
        return self._scrub(data, self.strings)

    def _scrub(self, data: object, strings: list[str]) -> object:
        if isinstance(data, dict):
            return {key: self._scrub(item, strings) for key, item in data.items()}
        if isinstance(data, list | tuple):
            return [self._scrub(item, strings) for item in data]
        if isinstance(data, str):
            if data in strings:
                return MASK
            for secret in strings:
                if len(secret) >= MIN_SCRUB_LENGTH and secret in data:
                    data = data.replace(secret, MASK)
            return data
        if data is not None and not isinstance(data, bool) and str(data) in strings:
            return MASK
        return data


NONE = Revealed()


def revealed_for(run_id) -> Revealed:
    """The run's secrets, unsealed (NONE when it has none). Raises ImproperlyConfigured when no
    configured key opens them."""
    return revealed_from(RunSecret.objects.filter(run_id=run_id).values_list("sealed", flat=True).first())


def revealed_from(sealed: str | None) -> Revealed:
    """`revealed_for`, from the run's `RunSecret.sealed` already read (None: it has none)."""
    if not sealed:
        return NONE
    revealed = Revealed(json.loads(RUN_SECRETS.unseal(sealed)))
    mask_in_logs(revealed.known_for_logs())  # whatever logs a line with them next, here
    return revealed


def sealed_of(run: Run) -> str | None:
    """The run's sealed secrets from a run read with `select_related("sealed_secrets")`."""
    try:
        return run.sealed_secrets.sealed
    except RunSecret.DoesNotExist:
        return None


def secrets_reseal() -> int:
    """Re-encrypt every run's secrets under the current key (after a key rotation, with the old
    key among the fallbacks). Returns how many runs' secrets were resealed."""
    count = 0
    for run_id, sealed in RunSecret.objects.values_list("run_id", "sealed").iterator():
        RunSecret.objects.filter(run_id=run_id).update(sealed=RUN_SECRETS.reseal(sealed))
        count += 1
    return count
