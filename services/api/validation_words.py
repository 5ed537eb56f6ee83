"""What a refused request got wrong, in words a client can act on: the ``detail`` and each
``errors[].msg`` of a 422 ``invalid_request`` problem (:mod:`services.api.problems`), instead
of pydantic's wording ("Input should be 'json', 'ndjson' or 'markdown_zip'", "List should
have at least 1 item after validation, not 0", "Input should be a valid UUID, invalid
character: expected an optional prefix of `urn:uuid:`...").

:func:`say` words one pydantic error (its ``type``, ``loc`` and ``ctx``: the error types of
pydantic-core, https://docs.pydantic.dev/latest/errors/validation_errors/); an error type it
does not know keeps pydantic's message after the field's name. :func:`summary` joins them
into a ``detail``. A short text the client sent (an id in the path, a format) is quoted back;
nothing longer, and never a whole list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

QUOTED_MAX = 40
"""A string the client sent is quoted back in the message up to this many characters."""

SHOWN_MAX = 5
"""At most this many problems are spelled out in a ``detail`` (``errors`` has them all)."""

HINTS: Mapping[tuple[str, ...], str] = {
    ("body", "note_ids"): 'give at least one note id, or "all": true',
    ("body", "events"): "give at least one event type (GET /v1/webhooks/event-types lists them)",
}
"""What to do about an empty list, by the field's location."""

_PLACES = {"path": "in the path", "query": "in the query", "header": "header"}


def field_name(loc: Sequence[Any]) -> str:
    """The field an error is about, as a client names it: ``note_ids[0]``, ``filter.status``,
    ``job_id in the path``, ``limit in the query``; ``the body`` for the whole body."""
    where, *rest = [str(part) for part in loc] or ["body"]
    name = ""
    for part in rest:
        name += f"[{part}]" if part.isdigit() else (f".{part}" if name else part)
    if where == "body" or where not in _PLACES:
        return name or "the body"
    if where == "header":
        return f"the {name} header"
    return f"{name} {_PLACES[where]}"


def _quoted(value: object) -> str:
    """``, not 'csv'`` for a short string the client sent; empty otherwise."""
    if isinstance(value, str) and len(value) <= QUOTED_MAX:
        return f", not {value!r}"
    return ""


def _choices(expected: str) -> str:
    """pydantic's ``'json', 'ndjson' or 'markdown_zip'`` without the quotes."""
    return expected.replace("'", "")


def _count(n: object, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def say(error: Mapping[str, Any]) -> str:
    """One pydantic validation error (``type``, ``loc``, ``ctx``, ``input``, ``msg``) as a
    sentence naming the field and what it must be."""
    kind = str(error.get("type", ""))
    loc = tuple(str(part) for part in error.get("loc", ()))
    field = field_name(loc)
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    given = error.get("input")
    unit = "character" if kind.startswith("string_") else "item"
    if kind == "json_invalid":
        return f"the body is not valid JSON ({ctx.get('error', 'cannot be parsed')})"
    if kind == "missing":
        return f"{field} is required"
    if kind == "extra_forbidden":
        return f"{field} is not a field of this request"
    if kind in ("literal_error", "enum"):
        return f"{field} must be one of {_choices(str(ctx.get('expected', '')))}{_quoted(given)}"
    if kind in ("too_short", "string_too_short"):
        least = ctx.get("min_length", 1)
        if least == 1 and unit == "item":
            hint = HINTS.get(loc)
            return f"{field} must not be empty" + (f": {hint}" if hint else "")
        return f"{field} must hold at least {_count(least, unit)}"
    if kind in ("too_long", "string_too_long"):
        most, actual = ctx.get("max_length"), ctx.get("actual_length")
        return f"{field} must hold at most {_count(most, unit)}" + (
            f", not {actual}" if actual is not None else ""
        )
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{field} must be an integer" + (
            " (a number, not a string)" if isinstance(given, str) else ""
        )
    if kind in ("bool_type", "bool_parsing"):
        return f"{field} must be true or false" + (
            " (a boolean, not a string)" if isinstance(given, str) else ""
        )
    if kind == "string_type":
        return f"{field} must be a string"
    if kind in ("float_type", "float_parsing"):
        return f"{field} must be a number"
    if kind in ("uuid_type", "uuid_parsing", "uuid_version"):
        return f"{field} must be a UUID{_quoted(given)}"
    if kind in ("datetime_type", "datetime_parsing", "datetime_from_date_parsing"):
        return f"{field} must be an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        words = {
            "greater_than_equal": ("at least", "ge"),
            "greater_than": ("more than", "gt"),
            "less_than_equal": ("at most", "le"),
            "less_than": ("less than", "lt"),
        }[kind]
        return f"{field} must be {words[0]} {ctx.get(words[1])}"
    if kind in ("list_type", "tuple_type", "set_type"):
        return f"{field} must be a list"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{field} must be a JSON object"
    if kind == "string_pattern_mismatch":
        return f"{field} does not have the expected form{_quoted(given)}"
    if kind in ("url_parsing", "url_scheme", "url_type", "url_syntax_violation"):
        return f"{field} must be an absolute URL{_quoted(given)}"
    message = str(error.get("msg", "is invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return f"{field}: {message}"


def summary(messages: Sequence[str]) -> str:
    """The ``detail`` of a 422: the problems' messages joined (at most :data:`SHOWN_MAX`, then
    how many more ``errors`` lists)."""
    if not messages:
        return "the request does not match the schema"
    shown = "; ".join(messages[:SHOWN_MAX])
    more = len(messages) - SHOWN_MAX
    return shown + (f"; and {more} more (see errors)" if more > 0 else "")
