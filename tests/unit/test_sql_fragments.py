"""SQL fragments (exportcore.sql): a column list several statements of a file share is
written once and expanded when its file is loaded; ``python -m exportcore.sql`` (``make
sql-show``) prints a statement expanded."""

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


def test_a_fragment_of_another_file_is_refused() -> None:
    """No cross-file includes (docs/architecture.md, "SQL by table"): a statement reads
    whole in its own file; what two files share is a database object."""
    text = "-- name: thing_load\nSELECT 1 FROM groups g {{outbox.job_row}}"
    with pytest.raises(ValueError, match="of another file"):
        parse(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-- name: a\nSELECT {{nope}}", "unknown SQL fragment {{nope}}"),
        ("-- name: a\nSELECT {{outbox.nope}}", "SQL fragment {{outbox.nope}} of another file"),
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


def test_the_fair_claim_and_the_held_back_gauge_count_in_flight_with_one_definition() -> None:
    """docs/architecture.md INV-16: what "in flight" means is written once (the function
    exports_pair_load, migration 0020) and read by both the claim and the gauge."""
    call = (
        "CROSS JOIN LATERAL exports_pair_load(g.tenant_id, g.queue, t.fast_in_flight, "
        "t.bulk_in_flight,\n"
    )
    for statement in (
        q("outbox", "outbox_mark_sent_and_claim_due"),
        q("metrics", "metrics_tenant_backlog"),
    ):
        assert call in statement
        assert "%(fast_cap)s, %(bulk_cap)s, %(sent_ids)s::uuid[]) l" in statement


def test_an_included_fragment_keeps_the_indentation_of_its_line() -> None:
    text = "-- fragment: guard\na = 1\n  AND b = 2\n-- name: x\nSELECT 1\n    WHERE {{guard}}\n"
    assert parse(text)["x"] == "SELECT 1\n    WHERE a = 1\n      AND b = 2"


def test_sql_show_prints_a_statement_expanded_by_name_or_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from exportcore.sql.__main__ import main

    assert main(["job_get"]) == 0
    assert capsys.readouterr().out == f"-- name: jobs.job_get\n{q('jobs', 'job_get')};\n"
    assert main(["outbox.outbox_mark_sent_many"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("-- name: outbox.outbox_mark_sent_many\n")
    assert "{{" not in out
    assert main(["checkpoints"]) == 0
    assert capsys.readouterr().out.count("-- name: checkpoints.") == len(
        parse((resources.files(sql) / "checkpoints.sql").read_text("utf-8"))
    )
    assert main(["no_such_statement"]) == 2
    assert "no_such_statement" in capsys.readouterr().err
