"""Where the database work of one export goes: ``pg_stat_statements`` and
``pg_stat_user_tables`` over a measured phase, divided per export (docs/performance.md,
"Where the database work goes").

The benchmark's PostgreSQL loads ``pg_stat_statements`` for every system alike
(:data:`SERVER_SETTINGS`, set by :func:`enable` with ``ALTER SYSTEM`` in the bench's own
data directory, never in the product's migrations): ``track = all``, so the statements a
trigger or a PL/pgSQL function runs (``exports_admit``, the history triggers, the peers'
functions) are counted as nested statements of their own beside the top-level statement
that caused them, and ``track_planning``, so planning time is counted too. The extension's
view is created in the template database only (:func:`create_extension`).

A phase (:class:`PhaseStats`) resets the statements of the system's database at its start
and reads them when its last job has succeeded: statement counters are updated when each
statement ends, so that reading is exact. Table counters (``n_tup_*``) are not: a backend
sends them at most once a second while busy, and an idle one up to
``PGSTAT_IDLE_INTERVAL`` (10 s) late, so they are read after ``settle_seconds`` of quiet at
both ends of the phase (the quiet's own writes, such as a poller's, are counted with it).

Each statement is named where possible (:class:`Catalog`): a top-level statement by the
named statement of ``libs/exportcore/src/exportcore/sql/*.sql`` whose text it is (compared
by :func:`normalize`d text: comments dropped, literals and parameters as ``?``, since
pg_stat_statements stores the text with its constants replaced), a nested statement by
the function of the database whose source contains it (``exports_admit(): update
admission_counters``); anything else by the start of its normalized text. Matching by text
costs the product nothing: no statement carries a marker for it.

The arithmetic (:func:`normalize`, :class:`Catalog`, :func:`statements_per_export`,
:func:`tables_per_export`, :func:`summarize`) is pure and unit-tested in
tests/unit/test_bench_pgstats.py; the reading needs a server.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import psycopg
from psycopg.rows import dict_row

from devtools.stack import Servers

# Loaded in the benchmark's server for every system (equal footing). ``max`` is the
# extension's default; a phase reports ``evicted`` > 0 if it ever was too small.
SERVER_SETTINGS: dict[str, str] = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.track_planning": "on",
}

# The counters read per statement (pg_stat_statements' own column names) and per table.
STATEMENT_COUNTERS = (
    "calls",
    "plans",
    "total_exec_time",
    "total_plan_time",
    "rows",
    "wal_bytes",
    "wal_records",
    "wal_fpi",
    "shared_blks_hit",
    "shared_blks_read",
    "shared_blks_dirtied",
    "shared_blks_written",
)
TIMES = ("total_exec_time", "total_plan_time")  # ms; every other counter is a count or bytes
TABLE_COUNTERS = ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del")
# How the per-export tables are sorted: WAL first, then execution time.
SORT_KEYS = ("wal_bytes", "total_exec_time")
LABEL_CHARS = 60  # of a statement's normalized text in an unnamed or nested label


# --- the server --------------------------------------------------------------------------


def enable(servers: Servers) -> dict[str, str]:
    """Make the benchmark's PostgreSQL load ``pg_stat_statements`` with
    :data:`SERVER_SETTINGS` (``ALTER SYSTEM`` in its data directory: the library first and a
    restart when it was not loaded yet, since PostgreSQL knows the extension's settings only
    once it is; then the settings and a reload); returns the settings in force. Raises
    RuntimeError when they did not take (the library missing from the PostgreSQL install:
    Debian's ``postgresql`` package ships it)."""
    library = "shared_preload_libraries"
    with psycopg.connect(servers.admin_dsn, autocommit=True) as conn:
        restart = _show(conn, library) != SERVER_SETTINGS[library]
        if restart:
            conn.execute(f"ALTER SYSTEM SET {library} = '{SERVER_SETTINGS[library]}'")
    if restart:
        servers.stop_pg()
        servers.start_pg()
    with psycopg.connect(servers.admin_dsn, autocommit=True) as conn:
        if _show(conn, library) == SERVER_SETTINGS[library]:
            for name, value in SERVER_SETTINGS.items():
                if name != library:
                    conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while True:  # a reload is applied asynchronously by the postmaster
            now = {name: _show(conn, name) for name in SERVER_SETTINGS}
            if now == SERVER_SETTINGS:
                return now
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the benchmark's PostgreSQL did not take {SERVER_SETTINGS} (it has {now}):"
                    " is pg_stat_statements installed (ls /usr/lib/postgresql/*/lib/)?"
                )
            time.sleep(0.1)


def _show(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
    return "" if row is None or row[0] is None else str(row[0])


def create_extension(dsn: str) -> None:
    """``CREATE EXTENSION pg_stat_statements`` in the database ``dsn`` (the benchmark's
    template, which every measured database copies)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def untracked(conn: psycopg.Connection[Any]) -> None:
    """Leave the statements of ``conn`` (the harness's own) out of pg_stat_statements."""
    conn.execute("SET pg_stat_statements.track = 'none'")


# --- normalized text -----------------------------------------------------------------------


def _skip_block_comment(sql: str, i: int) -> int:
    depth, n = 0, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def _skip_quoted(sql: str, i: int, quote: str) -> int:
    """The index after the quoted token starting at ``sql[i]`` (a doubled quote escapes)."""
    n = len(sql)
    i += 1
    while i < n:
        if sql[i] == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        if sql[i] == "\\" and quote == "'":
            i += 2  # E'…' escapes; harmless in a standard string without backslashes
            continue
        i += 1
    return n


# operators of more than one character kept as one token (longest first)
_OPERATORS = ("->>", "#>>", "||", "->", "#>", "<=", ">=", "<>", "!=", "::", ":=", "@>", "<@", "&&")


def tokens(sql: str) -> list[str]:
    """``sql`` as normalized tokens: comments dropped; string, number, boolean and NULL
    literals, ``$n`` and psycopg's ``%s`` / ``%(name)s`` parameters as ``?`` (a minus
    sign before one dropped, since pg_stat_statements takes a negative constant whole);
    keywords and unquoted identifiers lower-cased; a common operator of several characters
    (``::``, ``||``, ``->>``, ``<=`` …) one token; every other character a token."""
    out: list[str] = []
    i, n = 0, len(sql)

    def literal() -> None:
        if out and out[-1] == "-":
            out.pop()
        out.append("?")

    while i < n:
        c = sql[i]
        if c.isspace():
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            i = _skip_block_comment(sql, i)
        elif c == "'":
            i = _skip_quoted(sql, i, "'")
            literal()
        elif c == '"':
            j = _skip_quoted(sql, i, '"')
            out.append(sql[i:j])
            i = j
        elif c == "$":
            j = i + 1
            while j < n and sql[j].isdigit():
                j += 1
            if j > i + 1:  # $1
                literal()
                i = j
                continue
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            if j < n and sql[j] == "$":  # $tag$ … $tag$
                tag = sql[i : j + 1]
                end = sql.find(tag, j + 1)
                i = n if end < 0 else end + len(tag)
                literal()
            else:
                out.append(c)
                i += 1
        elif c == "%" and i + 1 < n:
            if sql[i + 1] == "s":
                literal()
                i += 2
            elif sql[i + 1] == "(":
                end = sql.find(")s", i)
                if end < 0:
                    out.append(c)
                    i += 1
                else:
                    literal()
                    i = end + 2
            elif sql[i + 1] == "%":
                out.append("%")
                i += 2
            else:
                out.append(c)
                i += 1
        elif c.isdigit() or (c == "." and i + 1 < n and sql[i + 1].isdigit()):
            j = i
            while j < n and (sql[j].isdigit() or sql[j] == "."):
                j += 1
            if (
                j < n
                and sql[j] in "eE"
                and j + 1 < n
                and (sql[j + 1].isdigit() or sql[j + 1] in "+-")
            ):
                j += 2
                while j < n and sql[j].isdigit():
                    j += 1
            literal()
            i = j
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (sql[j].isalnum() or sql[j] in "_$"):
                j += 1
            word = sql[i:j].lower()
            if word in ("true", "false", "null"):
                literal()
            else:
                out.append(word)
            i = j
        else:
            op = next((o for o in _OPERATORS if sql.startswith(o, i)), c)
            out.append(op)
            i += len(op)
    return out


def normalize(sql: str) -> str:
    """:func:`tokens` joined by single spaces: two texts of one statement (ours as written
    in a ``.sql`` file, and the text pg_stat_statements keeps, with its constants as
    ``$n``) normalize to the same string."""
    return " ".join(tokens(sql))


def _same(ours: str, seen: str) -> bool:
    """Whether token ``seen`` (pg_stat_statements' text) stands for token ``ours``: equal,
    or a ``?`` there. PostgreSQL also replaces constants that were keywords in the text
    (``extract(epoch FROM …)`` keeps ``extract($1 FROM …)``)."""
    return seen == ours or seen == "?"


def _matches(ours: Sequence[str], seen: Sequence[str]) -> bool:
    return len(ours) == len(seen) and all(_same(o, t) for o, t in zip(ours, seen, strict=True))


def _contains_in_order(haystack: Sequence[str], needle: Sequence[str], slack: int) -> bool:
    """Whether ``needle``'s tokens appear in ``haystack`` in order (:func:`_same`) within a
    window of ``len(needle) + slack`` tokens (PL/pgSQL sends ``SELECT … INTO v FROM …``
    without its ``INTO v``)."""
    if not needle:
        return False
    width = len(needle) + slack
    for start, tok in enumerate(haystack):
        if not _same(tok, needle[0]):
            continue
        pos, stop = start + 1, min(len(haystack), start + width)
        for t in needle[1:]:
            while pos < stop and not _same(haystack[pos], t):
                pos += 1
            if pos >= stop:
                break
            pos += 1
        else:
            return True
    return False


# words after which a parenthesis opens a list or a subquery, not a call's arguments
_KEYWORDS_BEFORE_PARENTHESIS = frozenset(
    [
        "as",
        "in",
        "values",
        "exists",
        "and",
        "or",
        "not",
        "from",
        "where",
        "on",
        "over",
        "filter",
        "select",
        "join",
        "using",
        "any",
        "all",
        "returning",
        "into",
        "set",
        "when",
        "then",
        "else",
        "by",
    ]
)


def _pretty(toks: Sequence[str], limit: int = LABEL_CHARS) -> str:
    """Tokens as SQL to read (no space inside parentheses, before a comma, around a dot
    or a cast, nor between a function and its arguments), cut after ``limit`` characters
    at a token's end (`` …`` then)."""
    text = ""
    for i, tok in enumerate(toks):
        prev = toks[i - 1] if i else ""
        tight = (
            not text
            or tok in (",", ")", ".", "::", "[", "]")
            or prev in ("(", ".", "::", "[")
            or (tok == "(" and prev.isidentifier() and prev not in _KEYWORDS_BEFORE_PARENTHESIS)
        )
        if len(text) >= limit:
            return text + " …"
        text += tok if tight else " " + tok
    return text


# pg_stat_statements' text of the referential-integrity check of a foreign key (ri_triggers.c)
_RI_CHECK = re.compile(r'^select \? from only "[^"]+" \. "([^"]+)" x where .* for key share of x$')


@dataclass
class Catalog:
    """Names for pg_stat_statements' rows: ``statements`` maps the normalized text of a
    named statement to its name (``jobs.job_submit``); ``functions`` maps a function's
    label (``exports_admit()``, ``trigger export_jobs_history()``) to its normalized
    source."""

    statements: dict[str, str] = field(default_factory=dict)
    functions: dict[str, list[str]] = field(default_factory=dict)
    _tokens: dict[str, list[str]] = field(default_factory=dict)  # normalized text -> tokens

    @classmethod
    def build(cls, named: Mapping[str, str], functions: Iterable[tuple[str, bool, str]]) -> Catalog:
        """From ``{name: sql}`` and ``(function name, is a trigger, source)`` rows. Two
        names with one text are both kept (``a | b``)."""
        cat = cls()
        for name, sql in sorted(named.items()):
            toks = tokens(sql)
            key = " ".join(toks)
            cat._tokens[key] = toks
            cat.statements[key] = (
                f"{cat.statements[key]} | {name}" if key in cat.statements else name
            )
        for fname, trigger, src in functions:
            label = f"trigger {fname}()" if trigger else f"{fname}()"
            cat.functions[label] = tokens(src)
        return cat

    def label(self, query: str, toplevel: bool) -> tuple[str, bool]:
        """``(label, named)`` of a statement's text: its named statement; the foreign key
        check of a table; the functions that hold a nested statement (with the statement's
        first words); or the first words of the text itself. ``named`` says whether one of
        the first three was found."""
        toks = tokens(query)
        short = _pretty(toks)
        key = " ".join(toks)
        if key in self.statements:
            return self.statements[key], True
        for text, name in self.statements.items():
            if _matches(self._tokens[text], toks):
                return name, True
        ri = _RI_CHECK.match(key)
        if ri:
            return f"foreign key check: {ri.group(1)}", True
        if not toplevel:
            # PL/pgSQL sends PERFORM f() as SELECT f(), and an expression as its text
            candidates = [toks, toks[1:]] if toks[:1] == ["select"] else [toks]
            for cand in candidates:
                # one text in several functions (constants apart) is one entry: all of them
                holders = [
                    fn for fn, src in self.functions.items() if _contains_in_order(src, cand, 4)
                ]
                if holders:
                    return f"{' | '.join(holders)}: {short}", True
        return short, False


def named_statements() -> dict[str, str]:
    """``{"<file>.<name>": sql}`` of every named statement of exportcore's ``sql/*.sql``,
    fragments expanded (the text the product sends)."""
    from exportcore import sql

    root = resources.files(sql.__name__)
    return {
        f"{agg}.{name}": text
        for agg in sql.aggregates()
        for name, text in sql.parse(root.joinpath(f"{agg}.sql").read_text("utf-8")).items()
    }


def read_functions(conn: psycopg.Connection[Any]) -> list[tuple[str, bool, str]]:
    """``(name, is a trigger, source)`` of the SQL and PL/pgSQL functions of the database's
    own schemas (ours and the peers')."""
    rows = conn.execute(
        """
        SELECT p.proname, p.prorettype = 'trigger'::regtype, p.prosrc
        FROM pg_proc p
        JOIN pg_namespace s ON s.oid = p.pronamespace
        JOIN pg_language l ON l.oid = p.prolang
        WHERE s.nspname NOT IN ('pg_catalog', 'information_schema')
          AND l.lanname IN ('plpgsql', 'sql')
        ORDER BY p.proname, p.oid
        """
    ).fetchall()
    return [(str(r[0]), bool(r[1]), str(r[2])) for r in rows]


# --- reading -------------------------------------------------------------------------------


def read_statements(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The pg_stat_statements rows of the current database: ``queryid``, ``toplevel``,
    ``query`` and :data:`STATEMENT_COUNTERS` (times in ms, WAL in bytes, blocks of 8 kB)."""
    cols = ", ".join(STATEMENT_COUNTERS)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"SELECT queryid, toplevel, query, {cols} FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return [
        {**r, **{c: float(r[c]) if c in TIMES else int(r[c]) for c in STATEMENT_COUNTERS}}
        for r in rows
    ]


def read_tables(conn: psycopg.Connection[Any]) -> dict[str, dict[str, int]]:
    """``{table: {counter: value}}`` of :data:`TABLE_COUNTERS` (``pg_stat_user_tables``)."""
    cols = ", ".join(TABLE_COUNTERS)
    rows = conn.execute(
        f"SELECT schemaname || '.' || relname, {cols} FROM pg_stat_user_tables"
    ).fetchall()
    return {
        str(r[0]).removeprefix("public."): {
            c: int(v) for c, v in zip(TABLE_COUNTERS, r[1:], strict=True)
        }
        for r in rows
    }


def evictions(conn: psycopg.Connection[Any]) -> int:
    """Entries pg_stat_statements dropped for want of room since its last full reset."""
    row = conn.execute("SELECT dealloc FROM pg_stat_statements_info").fetchone()
    return int(row[0]) if row else 0


def reset(conn: psycopg.Connection[Any]) -> None:
    """Forget the statements of the current database (the other databases' are kept)."""
    conn.execute(
        "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
        " WHERE datname = current_database()), 0)"
    )


# --- per export ---------------------------------------------------------------------------


def _round(v: float) -> float:
    return round(v, 4) if abs(v) < 100 else round(v, 1)


def statements_per_export(
    rows: Iterable[Mapping[str, Any]], exports: int, catalog: Catalog
) -> list[dict[str, Any]]:
    """pg_stat_statements ``rows`` of a phase of ``exports`` jobs, one entry per label and
    level (``top``: sent by a client; ``nested``: run by a function or trigger, whose
    counters are ALSO inside its top-level statement's), each with every counter per
    export and the phase's totals (``total``), sorted by WAL then execution time, most
    first; a row neither planned nor run in the phase is left out. Raises ValueError when
    ``exports`` < 1."""
    if exports < 1:
        raise ValueError(f"a phase of {exports} exports has nothing to divide by")
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if not r["calls"] and not r["plans"]:
            continue  # an entry made when the text was parsed, for a statement not run since
        label, named = catalog.label(str(r["query"]), bool(r["toplevel"]))
        level = "top" if r["toplevel"] else "nested"
        entry = merged.setdefault(
            (label, level),
            {
                "statement": label,
                "level": level,
                "named": named,
                "query": normalize(str(r["query"]))[:240],
                "total": dict.fromkeys(STATEMENT_COUNTERS, 0),
            },
        )
        for c in STATEMENT_COUNTERS:
            entry["total"][c] += r[c]
    out = []
    for e in merged.values():
        e["per_export"] = {c: _round(e["total"][c] / exports) for c in STATEMENT_COUNTERS}
        e["total"] = {c: _round(v) for c, v in e["total"].items()}
        out.append(e)
    out.sort(key=_statement_order)
    return out


def top_level_total(statements: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Per export, the sum over top-level statements only (a nested statement's counters
    are already inside the statement that called it)."""
    tot = dict.fromkeys(STATEMENT_COUNTERS, 0.0)
    for s in statements:
        if s["level"] == "top":
            for c in STATEMENT_COUNTERS:
                tot[c] += s["per_export"][c]
    return {c: _round(v) for c, v in tot.items()}


def tables_per_export(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]], exports: int
) -> list[dict[str, Any]]:
    """``pg_stat_user_tables`` deltas of a phase of ``exports`` jobs, per table that changed
    (inserted, updated, of those HOT, deleted; per export and in total), most rows written
    first. A table new in ``after`` counts from 0. Raises ValueError when ``exports`` < 1."""
    if exports < 1:
        raise ValueError(f"a phase of {exports} exports has nothing to divide by")
    out = []
    for table, counts in after.items():
        prev = before.get(table, {})
        delta = {c: int(counts.get(c, 0)) - int(prev.get(c, 0)) for c in TABLE_COUNTERS}
        if not any(delta.values()):
            continue
        out.append(
            {
                "table": table,
                "total": delta,
                "per_export": {c: _round(v / exports) for c, v in delta.items()},
            }
        )
    out.sort(key=_table_order)
    return out


def _statement_order(e: Mapping[str, Any]) -> tuple[Any, ...]:
    """Most WAL first, then most execution time, then by name."""
    return (*(-float(e["per_export"][k]) for k in SORT_KEYS), e["statement"])


def _table_order(t: Mapping[str, Any]) -> tuple[float, str]:
    """Most rows written (inserted + updated + deleted) first, then by name."""
    c = t["per_export"]
    return (-float(c["n_tup_ins"] + c["n_tup_upd"] + c["n_tup_del"]), str(t["table"]))


# --- one phase ----------------------------------------------------------------------------


class PhaseStats:
    """pg_stat_statements and pg_stat_user_tables over one phase, read from the harness's
    observer connection ``conn`` (untracked). :meth:`start` after the quiet that lets the
    previous work's table counters arrive; :meth:`statements` as soon as the phase's last
    job succeeded; :meth:`tables` after the quiet that follows."""

    def __init__(self, conn: psycopg.Connection[Any], catalog_named: Mapping[str, str]) -> None:
        self.conn, self.named = conn, catalog_named
        self._tables0: dict[str, dict[str, int]] = {}
        self._evicted0 = self._evicted = 0
        self._statements: list[dict[str, Any]] = []

    def start(self) -> None:
        self._tables0 = read_tables(self.conn)
        self._evicted0 = evictions(self.conn)
        reset(self.conn)

    def statements(self) -> None:
        self._statements = read_statements(self.conn)
        self._evicted = evictions(self.conn) - self._evicted0

    def result(self, exports: int, settled_seconds: float) -> dict[str, Any]:
        """Read the tables (the caller waited ``settled_seconds`` since the last job) and
        return ``{"statements", "statements_top_level", "tables", "exports", "evicted",
        "settle_seconds"}``, every figure per export."""
        tables = read_tables(self.conn)
        catalog = Catalog.build(self.named, read_functions(self.conn))
        statements = statements_per_export(self._statements, exports, catalog)
        return {
            "exports": exports,
            "statements": statements,
            "statements_top_level": top_level_total(statements),
            "tables": tables_per_export(self._tables0, tables, exports),
            "evicted": self._evicted,
            "settle_seconds": settled_seconds,
        }


# --- over runs ----------------------------------------------------------------------------


def summarize(phases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The median over runs of one system's phase (each a :meth:`PhaseStats.result`): per
    statement (label and level) and per table, each per-export counter's median, a run
    that lacks the entry counting 0; sorted as in one run. ``runs``: how many."""
    n = len(phases)
    stmts: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    named: dict[tuple[str, str], bool] = {}
    for ph in phases:
        for s in ph.get("statements", []):
            key = (s["statement"], s["level"])
            stmts.setdefault(key, []).append(s["per_export"])
            named[key] = bool(s.get("named"))
    tables: dict[str, list[Mapping[str, Any]]] = {}
    for ph in phases:
        for t in ph.get("tables", []):
            tables.setdefault(t["table"], []).append(t["per_export"])

    def med(values: list[Mapping[str, Any]], counters: Sequence[str]) -> dict[str, float]:
        return {
            c: _round(statistics.median([float(v[c]) for v in values] + [0.0] * (n - len(values))))
            for c in counters
        }

    s_out = [
        {
            "statement": k[0],
            "level": k[1],
            "named": named[k],
            "per_export": med(v, STATEMENT_COUNTERS),
        }
        for k, v in stmts.items()
    ]
    s_out.sort(key=_statement_order)
    t_out = [{"table": k, "per_export": med(v, TABLE_COUNTERS)} for k, v in tables.items()]
    t_out.sort(key=_table_order)
    return {
        "runs": n,
        "statements": s_out,
        "statements_top_level": top_level_total(s_out),
        "tables": t_out,
    }
