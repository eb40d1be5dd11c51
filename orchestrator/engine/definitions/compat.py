"""Schema compatibility: will every output of one step satisfy what another step requires?

Owns `schema_accepts(consumer, producer)`, a conservative structural check between two
JSON Schemas. "Conservative" means it may reject a pair that is in fact compatible, but
never accepts a pair where the producer could emit a value the consumer rejects. The
rules, applied recursively:

* Identical schemas are compatible; a consumer with no constraints accepts anything; a
  producer that constrains nothing is accepted only by such a consumer.
* A producer with `enum`/`const` is compatible when each of its values validates
  against the consumer (an exact check).
* Types: every type the producer may emit must be a consumer type (`integer` fits
  `number`). A producer without `type` may emit anything.
* `enum`: a consumer enum needs a producer enum (or const) within it.
* Numbers: the producer's `minimum`/`maximum` (and exclusive forms) must lie inside the
  consumer's. Strings: `minLength`/`maxLength` inside the consumer's; a consumer
  `pattern` must be repeated verbatim. Arrays: `minItems`/`maxItems`/`uniqueItems`, and
  `items` recursively.
* Objects: the consumer's `required` must be a subset of the producer's; each consumer
  property is compared with the producer's property of that name (or the producer's
  `additionalProperties` schema); a property the producer does not declare, while
  allowing unknown properties, is incompatible because it could hold anything. A
  consumer `additionalProperties: false` needs a producer with `additionalProperties:
  false` and no properties beyond the consumer's.
* Combinators: a consumer `anyOf` accepts if one branch does, `allOf` if all do; a
  producer `anyOf`/`oneOf` is accepted if every branch is. Producer keywords the check
  does not know only narrow what it emits, so they are ignored; consumer keywords it does
  not know (`$ref`, `oneOf`, `not`, `if`, `patternProperties`, ...) make it reject unless
  the two schemas are identical.

It must not raise on any input: malformed schemas are reported as incompatible.
"""

from __future__ import annotations

import math

from jsonschema import Draft202012Validator

from .structure import is_valid_schema

_ANNOTATIONS = frozenset(
    {
        "$schema", "$id", "$anchor", "$comment", "$defs", "definitions", "title",
        "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
        "format", "contentMediaType", "contentEncoding",
    }
)  # fmt: skip
_UNDERSTOOD = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties", "items",
        "minItems", "maxItems", "uniqueItems", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "minLength", "maxLength", "pattern", "anyOf", "allOf",
    }
)  # fmt: skip
_ALL_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})


def schema_accepts(consumer: object, producer: object) -> str | None:
    """None if every value valid under `producer` is valid under `consumer`, else why not."""
    if not (is_valid_schema(consumer) and is_valid_schema(producer)):
        return "the schemas cannot be compared: one of them is not a valid JSON Schema"
    try:
        return _check(consumer, producer, "output")
    except (TypeError, ValueError, AttributeError, RecursionError) as error:
        return f"the schemas cannot be compared ({error})"


def _check(consumer: object, producer: object, where: str) -> str | None:
    if consumer == producer or _unconstrained(consumer):
        return None
    if consumer is False:
        return f"{where}: the consumer accepts nothing"
    if producer is False:
        return None
    if not isinstance(consumer, dict):
        return f"{where}: the consumer schema is not a schema"
    if _unconstrained(producer):
        return f"{where}: the producer does not constrain its output"
    if not isinstance(producer, dict):
        return f"{where}: the producer schema is not a schema"

    values = _finite_values(producer)
    if values is not None:
        return _check_values(consumer, values, where)

    for keyword in ("anyOf", "oneOf"):
        if isinstance(producer.get(keyword), list):
            for branch in producer[keyword]:
                reason = _check(consumer, branch, where)
                if reason:
                    return reason
            return None

    unknown = sorted(set(consumer) - _ANNOTATIONS - _UNDERSTOOD)
    if unknown:
        return f"{where}: the consumer uses {unknown[0]!r}, which the compatibility check cannot compare"

    if isinstance(consumer.get("allOf"), list):
        base = {key: value for key, value in consumer.items() if key != "allOf"}
        for branch in [base, *consumer["allOf"]]:
            reason = _check(branch, producer, where)
            if reason:
                return reason
        return None
    if isinstance(consumer.get("anyOf"), list):
        base = {key: value for key, value in consumer.items() if key != "anyOf"}
        reasons = [_check(branch, producer, where) for branch in consumer["anyOf"]]
        if all(reasons):
            return reasons[0] if reasons else f"{where}: the consumer's anyOf is empty"
        return _check(base, producer, where)

    return (
        _check_types(consumer, producer, where)
        or _check_enum(consumer, where)
        or _check_numbers(consumer, producer, where)
        or _check_strings(consumer, producer, where)
        or _check_arrays(consumer, producer, where)
        or _check_objects(consumer, producer, where)
    )


def _unconstrained(schema: object) -> bool:
    return schema is True or (isinstance(schema, dict) and not set(schema) - _ANNOTATIONS)


def _finite_values(producer: dict) -> list | None:
    if "const" in producer:
        return [producer["const"]]
    if isinstance(producer.get("enum"), list):
        return list(producer["enum"])
    return None


def _check_values(consumer: object, values: list, where: str) -> str | None:
    validator = Draft202012Validator(consumer)
    for value in values:
        try:
            error = next(validator.iter_errors(value), None)
        except Exception:  # an unresolvable $ref and the like: cannot tell, so reject
            return f"{where}: the consumer schema cannot be evaluated"
        if error is not None:
            return f"{where}: the producer may output {value!r}, which the consumer rejects ({error.message})"
    return None


def _types(schema: dict) -> frozenset[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list):
        return frozenset(declared)
    return _ALL_TYPES


def _check_types(consumer: dict, producer: dict, where: str) -> str | None:
    if "type" not in consumer:
        return None
    accepted = _types(consumer)
    if "type" not in producer:
        return (
            f"{where}: the producer does not declare a type, the consumer expects {_list(accepted)}"
        )
    for emitted in sorted(_types(producer)):
        if emitted in accepted or (emitted == "integer" and "number" in accepted):
            continue
        return f"{where}: the producer may output {emitted}, the consumer expects {_list(accepted)}"
    return None


def _check_enum(consumer: dict, where: str) -> str | None:
    # Reached only when the producer has no enum/const (see _finite_values).
    if "enum" in consumer or "const" in consumer:
        allowed = consumer["enum"] if "enum" in consumer else [consumer["const"]]
        return f"{where}: the consumer only accepts {allowed!r}, the producer's values are not restricted to them"
    return None


def _bound(schema: dict, inclusive: str, exclusive: str, pick) -> tuple[float, bool] | None:
    """The tightest bound as (value, is_exclusive), or None."""
    candidates = []
    if _is_number(schema.get(inclusive)):
        candidates.append((schema[inclusive], False))
    if _is_number(schema.get(exclusive)):
        candidates.append((schema[exclusive], True))
    if not candidates:
        return None
    return pick(candidates)


def _check_numbers(consumer: dict, producer: dict, where: str) -> str | None:
    if not _types(producer) & {"number", "integer"}:
        return None

    def tighter_low(pairs):
        return max(pairs, key=lambda pair: (pair[0], pair[1]))

    def tighter_high(pairs):
        return min(pairs, key=lambda pair: (pair[0], not pair[1]))

    for side, inclusive, exclusive, pick, inside in (
        ("minimum", "minimum", "exclusiveMinimum", tighter_low, lambda p, c: p > c),
        ("maximum", "maximum", "exclusiveMaximum", tighter_high, lambda p, c: p < c),
    ):
        wanted = _bound(consumer, inclusive, exclusive, pick)
        if wanted is None:
            continue
        have = _bound(producer, inclusive, exclusive, pick)
        if have is None:
            return (
                f"{where}: the consumer requires a {side} of {_show(wanted)}, the producer has none"
            )
        fits = inside(have[0], wanted[0]) or (have[0] == wanted[0] and (have[1] or not wanted[1]))
        if not fits:
            return f"{where}: the producer's {side} {_show(have)} is outside the consumer's {_show(wanted)}"
    return None


def _check_strings(consumer: dict, producer: dict, where: str) -> str | None:
    if "string" not in _types(producer):
        return None
    reason = _check_length(consumer, producer, "minLength", "maxLength", where)
    if reason:
        return reason
    if "pattern" in consumer and consumer["pattern"] != producer.get("pattern"):
        return f"{where}: the consumer requires pattern {consumer['pattern']!r}, the producer does not guarantee it"
    return None


def _check_arrays(consumer: dict, producer: dict, where: str) -> str | None:
    if "array" not in _types(producer):
        return None
    reason = _check_length(consumer, producer, "minItems", "maxItems", where)
    if reason:
        return reason
    if consumer.get("uniqueItems") is True and producer.get("uniqueItems") is not True:
        return f"{where}: the consumer requires unique items, the producer does not guarantee them"
    if "items" in consumer:
        return _check(consumer["items"], producer.get("items", True), f"{where}[]")
    return None


def _check_length(consumer: dict, producer: dict, low: str, high: str, where: str) -> str | None:
    if _is_number(consumer.get(low)) and producer.get(low, 0) < consumer[low]:
        return f"{where}: the consumer requires {low} {consumer[low]}, the producer guarantees {producer.get(low, 0)}"
    if _is_number(consumer.get(high)):
        if not _is_number(producer.get(high)) or producer[high] > consumer[high]:
            return f"{where}: the consumer allows {high} {consumer[high]}, the producer allows {producer.get(high, 'any')}"
    return None


def _check_objects(consumer: dict, producer: dict, where: str) -> str | None:
    if "object" not in _types(producer):
        return None
    produced = producer.get("properties") if isinstance(producer.get("properties"), dict) else {}
    expected = consumer.get("properties") if isinstance(consumer.get("properties"), dict) else {}
    producer_extra = producer.get("additionalProperties", True)
    consumer_extra = consumer.get("additionalProperties", True)

    guaranteed = set(producer.get("required") or [])
    for name in consumer.get("required") or []:
        if name not in guaranteed:
            return f"{where}: the consumer requires {name!r}, the producer does not guarantee it"

    for name, wanted in expected.items():
        if name in produced:
            source = produced[name]
        elif producer_extra is False:
            continue  # the producer never emits it
        elif _unconstrained(wanted):
            continue
        elif producer_extra is True or _unconstrained(producer_extra):
            return f"{where}.{name}: the producer does not declare this property, so it could hold anything"
        else:
            source = producer_extra
        reason = _check(wanted, source, f"{where}.{name}")
        if reason:
            return reason

    if consumer_extra is False:
        if producer_extra is not False:
            return f"{where}: the consumer allows no extra properties, the producer may add some"
        extra = sorted(set(produced) - set(expected))
        if extra:
            return f"{where}: the consumer does not allow property {extra[0]!r}, which the producer may output"
    elif not _unconstrained(consumer_extra):
        for name in sorted(set(produced) - set(expected)):
            reason = _check(consumer_extra, produced[name], f"{where}.{name}")
            if reason:
                return reason
        if producer_extra is not False:
            reason = _check(consumer_extra, producer_extra, f"{where}.*")
            if reason:
                return reason
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _show(bound: tuple[float, bool]) -> str:
    value, exclusive = bound
    return f"{value} (exclusive)" if exclusive else f"{value}"


def _list(types: frozenset[str]) -> str:
    return " or ".join(sorted(types))
