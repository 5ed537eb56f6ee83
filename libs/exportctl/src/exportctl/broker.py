"""``exportctl broker inspect``: what Redis holds per queue, reconciled against PostgreSQL
(CELERY_BROKER_URL and DATABASE_URL, like the processes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import psycopg
import typer

from exportcore import audit
from exportcore.audit import Actor
from exportctl.common import app, db_pool, err, fail, load_settings, out
from exportctl.exits import EXIT_UNAVAILABLE
from exportctl.output import AsJson, Output, OutputOpt, emit_object, mode
from exportctl.tables import Col, fit

if TYPE_CHECKING:
    from exportcore.broker_inspect import BrokerReport

broker_app = typer.Typer(help="The broker (Redis): queues, unacked messages.", no_args_is_help=True)
app.add_typer(broker_app, name="broker")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _print(report: BrokerReport, show: int) -> None:
    """The report as tables fitted to the terminal: queue names and job ids always whole
    (an 80-column terminal shows every count; the message and lost-job lists drop their
    least useful columns first)."""
    out.print(
        fit(
            [
                Col("queue", lambda q: q[0]),
                Col("ready", lambda q: q[1].ready, justify="right"),
                Col("unacked", lambda q: q[1].unacked, justify="right"),
                Col("oldest\nready", lambda q: _age(q[1].oldest_ready_age), 1, "right"),
                Col("oldest\nunacked", lambda q: _age(q[1].oldest_unacked_age), 1, "right"),
                Col("stale", lambda q: q[1].stale, justify="right"),
                Col("unknown", lambda q: q[1].unknown, justify="right"),
                Col("lost", lambda q: q[1].lost, justify="right"),
            ],
            sorted(report.queues.items()),
        )
    )
    if report.stale or report.unknown or report.unreadable:
        listed = [
            (kind, m)
            for kind, rows in (
                ("stale", report.stale),
                ("unknown", report.unknown),
                ("unreadable", report.unreadable),
            )
            for m in rows[:show]
        ]
        out.print(
            fit(
                [
                    Col("kind", lambda r: r[0]),
                    Col("queue", lambda r: r[1].queue),
                    Col("job", lambda r: r[1].job_id),
                    Col("job status", lambda r: r[1].job_status, priority=1),
                    Col("state", lambda r: r[1].state, priority=2),
                    Col("age", lambda r: _age(r[1].age), 3, "right"),
                ],
                listed,
            )
        )
    if report.lost:
        out.print(
            fit(
                [
                    Col("lost job (queued, no message)", lambda r: r["id"]),
                    Col("queue", lambda r: r["queue"]),
                    Col("dispatches", lambda r: r["dispatch_count"], 1, "right"),
                    Col("waiting", lambda r: _age(r["waiting"]), 2, "right"),
                ],
                report.lost[:show],
            )
        )
        err.print(
            "lost jobs are re-dispatched by the recovery-scanner after DISPATCH_THRESHOLD_SECONDS"
        )
    if report.truncated:
        from exportcore.broker_inspect import INSPECT_LIMIT

        err.print(
            f"[yellow]a queue holds more than {INSPECT_LIMIT} messages:[/] counts "
            "are exact, the reconciliation covers the oldest ones"
        )


@broker_app.command("inspect")
def inspect(
    purge_stale: Annotated[
        bool,
        typer.Option(
            "--purge-stale",
            help="remove the messages of terminal jobs (succeeded, failed, cancelled) and "
            "nothing else",
        ),
    ] = False,
    output: OutputOpt = None,
    as_json: AsJson = False,
    show: Annotated[int, typer.Option(min=0, help="rows of each list to print")] = 20,
) -> None:
    """Per queue: ready and unacked messages with their oldest ages, messages of terminal
    or unknown jobs, and queued jobs with no message and no unsent outbox event.
    Read-only unless --purge-stale."""
    # imported here: kombu and Celery cost every other command (probes included) a second
    import redis

    from exportcore.broker_inspect import BrokerInspector

    settings = load_settings()
    with db_pool() as pool:
        inspector = BrokerInspector.from_settings(settings, pool)
        try:
            report = inspector.inspect(purge_stale=purge_stale)
        except redis.RedisError as exc:
            raise fail(
                f"cannot read the broker ({type(exc).__name__}); check CELERY_BROKER_URL and "
                "that Redis is running",
                EXIT_UNAVAILABLE,
            ) from None
        except psycopg.OperationalError as exc:
            raise fail(
                f"cannot query the database ({type(exc).__name__})", EXIT_UNAVAILABLE
            ) from None
        finally:
            inspector.client.close()
        if report.purged is not None:
            # Redis has no transaction to share with PostgreSQL: the purge is recorded right
            # after it, with what it removed (nothing else was touched).
            with pool.connection() as conn:
                audit.record(
                    conn,
                    Actor.database(),
                    "purge_stale",
                    target_kind="broker",
                    count=report.purged["ready"] + report.purged["unacked"],
                    detail=dict(report.purged),
                )
    how = mode(output, as_json)
    if how is Output.table:
        _print(report, show)
    else:
        emit_object(report.as_json(), how)
    if report.purged is not None:
        ready, unacked = report.purged["ready"], report.purged["unacked"]
        err.print(
            f"purged {ready} ready and {unacked} unacked "
            f"{'message' if ready + unacked == 1 else 'messages'} of terminal jobs"
        )
