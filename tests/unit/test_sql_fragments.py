"""SQL fragments (exportcore.sql): a piece several statements share is written once and
expanded when its file is loaded."""

from __future__ import annotations

from importlib import resources

import pytest

from exportcore import sql
from exportcore.sql import parse, q

TEXT = """-- header

-- fragment: cols
-- what the fragment is (this comment is not copied)
j.id, j.name

-- fragment: row
{{cols}}, j.extra

-- name: thing_get
SELECT {{row}} FROM things j WHERE j.id = %(id)s;
"""


def test_a_fragment_is_expanded_where_it_is_included_and_is_no_statement() -> None:
    statements = parse(TEXT)
    assert statements == {
        "thing_get": "SELECT j.id, j.name, j.extra FROM things j WHERE j.id = %(id)s"
    }


def test_a_fragment_of_another_file_is_included_by_file_and_name() -> None:
    text = "-- name: thing_load\nSELECT 1 FROM groups g {{outbox.outbox_pair_load}}"
    expanded = parse(text)["thing_load"]
    assert "LEFT JOIN tenants t ON t.id = g.tenant_id" in expanded
    assert "LIMIT c.cap" in expanded
    assert "{{" not in expanded and "-- fragment" not in expanded


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT {{nope}}", "unknown SQL fragment {{nope}}"),
        ("-- name: a\nSELECT {{outbox.nope}}", "unknown SQL fragment {{outbox.nope}}"),
        ("-- fragment: x\n{{x}}\n-- name: a\nSELECT {{x}}", "includes itself"),
        ("-- fragment: a\n1\n-- name: a\nSELECT 1", "duplicate SQL statement name 'a'"),
        ("-- name: a\nSELECT 1\n-- name: a\nSELECT 2", "duplicate SQL statement name 'a'"),
    ],
)
def test_a_broken_file_is_refused_when_loaded(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
        parse(text)


def test_no_shipped_statement_keeps_an_include_or_exposes_a_fragment() -> None:
    for path in resources.files(sql).iterdir():
        if not path.name.endswith(".sql"):
            continue
        text = path.read_text("utf-8")
        for name, statement in parse(text).items():
            assert "{{" not in statement and "}}" not in statement, name
        for line in text.splitlines():
            if line.startswith("-- fragment:"):
                with pytest.raises(KeyError):
                    q(path.name.removesuffix(".sql"), line.split(":", 1)[1].strip())


def test_the_fair_claim_and_the_held_back_gauge_count_in_flight_with_one_text() -> None:
    """docs/architecture.md INV-16: what "in flight" means is written once (outbox.sql
    fragment outbox_pair_load) and read by both the claim and the gauge."""

    def lines(text: str) -> str:
        return "\n".join(line.strip() for line in text.splitlines())

    load = lines(parse("-- name: probe\n{{outbox.outbox_pair_load}}")["probe"])
    assert "LIMIT c.cap" in load
    assert load in lines(q("outbox", "outbox_mark_sent_and_claim_due"))
    assert load in lines(q("metrics", "metrics_tenant_backlog"))


def test_an_included_fragment_keeps_the_indentation_of_its_line() -> None:
    text = "-- fragment: guard\na = 1\n  AND b = 2\n-- name: x\nSELECT 1\n    WHERE {{guard}}\n"
    assert parse(text)["x"] == "SELECT 1\n    WHERE a = 1\n      AND b = 2"
