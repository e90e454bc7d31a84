"""Hypothesis strategies for request bodies from a JSON Schema (``msgspec.json.schema`` of
a body Struct), and the hostile versions of those bodies a careless or hostile client
sends: values of the wrong type, unknown and missing fields, huge numbers and strings,
then bytes no JSON encoder writes (NaN literals, invalid UTF-8, duplicate keys, deep
nesting, truncation).

Only what msgspec's schemas use is understood: ``$ref`` into ``$defs``, ``anyOf``,
``enum``, the JSON types with their bounds, and objects with ``properties``, ``required``
and ``additionalProperties: false``.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

SMALL_SPAN = 40  # most integers near their lower bound: token ids a toy vocabulary holds
MAX_DRAWN_ITEMS = 6  # arrays of a few items: the bounds are exercised by the huge values
# values no schema allows, in every JSON type: past u64 and i64, floats at the edges
HUGE_INTS = (-(1 << 63) - 1, -1, (1 << 63) - 1, 1 << 64, 10 ** 30)
EDGE_FLOATS = (0.0, -0.0, 5e-324, 1e-320, 1e308, -1e308, 1e-7, 0.5)


def _resolve(schema: dict, defs: dict) -> dict:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _integers(s: dict, caps: dict, name: str) -> st.SearchStrategy:
    lo, hi = s.get("minimum"), caps.get(name, s.get("maximum"))
    base = lo if lo is not None else 0
    near = st.integers(base, base + SMALL_SPAN if hi is None else min(hi, base + SMALL_SPAN))
    return st.one_of(near, st.integers(lo, hi))


def _numbers(s: dict) -> st.SearchStrategy:
    lo, hi = s.get("minimum", s.get("exclusiveMinimum")), s.get("maximum")
    inside = st.floats(lo, hi, allow_nan=False, allow_infinity=False,
                       exclude_min="exclusiveMinimum" in s)
    return st.one_of(inside, st.integers(0, 3)) if lo is None or lo <= 0 else inside


def from_schema(schema: dict, defs: dict | None = None, caps: dict | None = None,
                name: str = "") -> st.SearchStrategy:
    """Values ``schema`` allows (of every optional property, a random subset); ``caps``:
    a lower maximum for integer properties by name (max_tokens: the run's own bound)."""
    defs = schema.get("$defs", {}) if defs is None else defs
    caps = caps or {}
    s = _resolve(schema, defs)
    if "anyOf" in s:
        return st.one_of(*[from_schema(a, defs, caps, name) for a in s["anyOf"]])
    if "enum" in s:
        return st.sampled_from(s["enum"])
    kind = s.get("type")
    if kind == "object":
        props = s.get("properties", {})
        required = set(s.get("required", ()))
        return st.fixed_dictionaries(
            {k: from_schema(v, defs, caps, k) for k, v in props.items() if k in required},
            optional={k: from_schema(v, defs, caps, k) for k, v in props.items()
                      if k not in required})
    if kind == "array":
        lo = s.get("minItems", 0)
        return st.lists(from_schema(s.get("items", {}), defs, caps, name), min_size=lo,
                        max_size=max(lo, min(s.get("maxItems", MAX_DRAWN_ITEMS), MAX_DRAWN_ITEMS)))
    if kind == "integer":
        return _integers(s, caps, name)
    if kind == "number":
        return _numbers(s)
    if kind == "string":
        lo = s.get("minLength", 0)
        return st.text(min_size=lo, max_size=max(lo, 12))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return any_json()


def any_json() -> st.SearchStrategy:
    """Any JSON value, the edge numbers often: what a wrong-typed field holds."""
    leaves = st.one_of(st.none(), st.booleans(), st.sampled_from(HUGE_INTS),
                       st.sampled_from(EDGE_FLOATS), st.integers(), st.text(max_size=8),
                       st.floats(allow_nan=False, allow_infinity=False))
    return st.recursive(leaves, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
        max_leaves=8)


@st.composite
def mutated(draw, body: dict) -> dict:
    """``body`` with one field changed the way a careless client changes it."""
    body = dict(body)
    how = draw(st.sampled_from(["wrong_value", "unknown_field", "drop_field", "nested"]))
    keys = sorted(body)
    if how == "wrong_value" and keys:
        body[draw(st.sampled_from(keys))] = draw(any_json())
    elif how == "drop_field" and keys:
        del body[draw(st.sampled_from(keys))]
    elif how == "nested" and keys:  # a wrong value one level down (an object's field)
        key = draw(st.sampled_from(keys))
        body[key] = {draw(st.text(max_size=6)): body[key]}
    else:
        body[draw(st.text(min_size=1, max_size=10))] = draw(any_json())
    return body


RAW_EDITS = ("truncate", "nan", "invalid_utf8", "duplicate_key", "deep_nesting", "empty",
             "not_object", "oversized")
DEEP = 20_000  # nesting levels: far past any recursion limit, well under the body bound


@st.composite
def raw_edit(draw, data: bytes) -> bytes:
    """``data`` (a JSON object's bytes) as no JSON encoder writes it."""
    how = draw(st.sampled_from(RAW_EDITS))
    if how == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "nan":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0"]))
        return data[:-1] + b',"temperature":' + literal + b"}"
    if how == "invalid_utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\\ud800"]))
        return data[:-1] + b',"user":"' + bad + b'"}'
    if how == "duplicate_key":
        key = draw(st.sampled_from(sorted(json.loads(data)) or ["max_tokens"]))
        again = json.dumps(draw(any_json())).encode()
        return data[:-1] + b',"' + key.encode() + b'":' + again + b"}"
    if how == "deep_nesting":
        return b'{"max_tokens":' + b"[" * DEEP + b"]" * DEEP + b"}"
    if how == "empty":
        return b""
    if how == "oversized":  # past the 1 MiB body bound by one byte (413)
        return data + b" " * ((1 << 20) + 1 - len(data))
    return json.dumps(draw(any_json())).encode()  # a non-object (or an object of nothing)
