"""Payload checks against an action's JSON Schema (``stage(schema=)``), shared by the producer,
which checks an edit before sending it, and the worker, which checks it again before the
handler sees it (a request written to the stream by hand never went through a producer)."""

from __future__ import annotations

from typing import Any, cast

import orjson
from jsonschema import exceptions as schema_errors
from jsonschema import validators

from pending_actions.broker.errors import InvalidInput
from pending_actions.broker.settings import Settings

# The deepest nesting of any JSON input (payload, schema, extra, edit, and each field of an
# HTTP body): an object or a list is one level. Far below orjson's own limit (254), which
# would otherwise answer a bare TypeError, and below any recursion a reader of it may do.
MAX_DEPTH = 64


def check_schema(schema: object) -> dict[str, Any] | None:
    """``schema`` itself is a JSON Schema (of the dialect its ``$schema`` names, else the
    latest); raises InvalidInput naming ``schema``."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise InvalidInput("schema", f"must be a JSON Schema object, got {type(schema).__name__}")
    try:
        validators.validator_for(schema).check_schema(schema)
    except schema_errors.SchemaError as exc:
        raise InvalidInput("schema", f"not a valid JSON Schema: {exc.message}") from None
    return schema


def check_payload(payload: object, schema: dict[str, Any] | None, field: str) -> None:
    """``payload`` meets ``schema`` (when there is one); the most relevant problem is raised
    as InvalidInput naming ``field``."""
    if schema is None:
        return
    error = schema_errors.best_match(
        validators.validator_for(schema)(schema).iter_errors(cast(Any, payload)))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise InvalidInput(field, error.message + (f" (at /{where})" if where else ""))


def check_depth(value: object, field: str, limit: int = MAX_DEPTH) -> None:
    """``value`` nests at most ``limit`` levels (an object or a list is one; a scalar none);
    else InvalidInput naming ``field``. Iterative, and it stops at the first level too deep:
    a value a caller built in Python may be nested far past any recursion limit."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list | tuple) else None
        if children is None:
            continue
        if depth > limit:
            raise InvalidInput(field, f"nested deeper than {limit} levels")
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))


def check_json(value: object, field: str, max_bytes: int, what: str = "") -> None:
    """The limits every JSON input meets (payload, extra, edit, schema): its depth
    (``MAX_DEPTH``), then its size as stored (``check_size``); the depth first, as orjson
    refuses deep values itself."""
    check_depth(value, field)
    check_size(value, field, max_bytes, what)


def max_body_bytes(settings: Settings) -> int:
    """The largest HTTP request body ``serve`` reads: room for a stage's payload and its
    schema at their limit (``max_payload_bytes`` each), a resolve's ``extra`` at its own, and
    1 MiB for everything else (a batch's reasons). Derived, so raising a limit raises it."""
    return 2 * settings.max_payload_bytes + settings.max_extra_bytes + 1_048_576


def check_size(value: object, field: str, limit: int, what: str = "") -> None:
    """``value`` is JSON of at most ``limit`` bytes (as stored, orjson); else InvalidInput
    naming ``field``, the size said after ``what``."""
    try:
        size = len(orjson.dumps(value))
    except TypeError as exc:
        raise InvalidInput(field, f"not JSON-serialisable: {exc}") from None
    if size > limit:
        raise InvalidInput(field, f"{what}{size} bytes; the limit is {limit}")
