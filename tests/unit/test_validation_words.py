"""A 422's words (services.api.validation_words): each pydantic error named by its field and
said as what to fix, the client's short input quoted back, pydantic's wording never shown;
checked on the errors pydantic really raises for the API's own request models."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from services.api.schemas import ExportCreate
from services.api.validation_words import SHOWN_MAX, field_name, say, summary


def errors_of(model: type[BaseModel], body: Any) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(body)
    return [say({**e, "loc": ("body", *e["loc"])}) for e in raised.value.errors()]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (
            {"all": True, "format": "csv"},
            ["format must be one of json, ndjson or markdown_zip, not 'csv'"],
        ),
        (
            {"note_ids": []},
            ['note_ids must not be empty: give at least one note id, or "all": true'],
        ),
        ({"note_ids": ["1"]}, ["note_ids[0] must be an integer (a number, not a string)"]),
        ({"all": "true"}, ["all must be true or false (a boolean, not a string)"]),
        ({"all": True, "extra": 1}, ["extra is not a field of this request"]),
        ({"all": True, "since": "abc"}, ["since must be a UUID, not 'abc'"]),
        ([1], ["the body must be a JSON object"]),
        (
            {"note_ids": list(range(100_001))},
            ["note_ids must hold at most 100000 items, not 100001"],
        ),
    ],
)
def test_the_submit_body_errors_in_words(body: Any, said: list[str]) -> None:
    assert errors_of(ExportCreate, body) == said


class Page(BaseModel):
    limit: int = Field(ge=1, le=500)
    label: str = Field(min_length=3)


def test_bounds_lengths_and_places() -> None:
    assert errors_of(Page, {"limit": 0, "label": "ab"}) == [
        "limit must be at least 1",
        "label must hold at least 3 characters",
    ]
    assert errors_of(Page, {"label": "abc"}) == ["limit is required"]
    with pytest.raises(ValidationError) as raised:
        TypeAdapter(int).validate_python("x")
    (error,) = raised.value.errors()
    assert say({**error, "loc": ("query", "limit")}) == (
        "limit in the query must be an integer (a number, not a string)"
    )
    assert field_name(("path", "job_id")) == "job_id in the path"
    assert field_name(("body", "filter", "status")) == "filter.status"
    assert field_name(("header", "idempotency-key")) == "the idempotency-key header"
    assert field_name(("body",)) == "the body"


def test_a_long_input_is_not_quoted_back_and_unknown_types_keep_their_reason() -> None:
    long = "x" * 41
    assert say({"type": "uuid_parsing", "loc": ("path", "job_id"), "input": long}) == (
        "job_id in the path must be a UUID"
    )
    assert say(
        {"type": "value_error", "loc": ("body", "since"), "msg": "Value error, expected X"}
    ) == ("since: expected X")


def test_the_detail_joins_the_first_problems() -> None:
    assert summary(["a", "b"]) == "a; b"
    many = [str(i) for i in range(SHOWN_MAX + 2)]
    assert summary(many).endswith("; and 2 more (see errors)")
    assert summary([]) == "the request does not match the schema"
