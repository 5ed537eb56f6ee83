"""``exportctl healthcheck``: the heartbeat check for a person (the chart's exec probes run the
same check as ``python -m exportcore.liveness``, which loads no more than the standard
library)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exportcore.liveness import check
from exportctl.common import app, fail
from exportctl.exits import EXIT_USAGE


@app.command()
def healthcheck(
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            envvar="HEARTBEAT_FILE",
            help="the heartbeat file the process touches (env HEARTBEAT_FILE; without "
            "either, exit 2)",
            show_default=False,
        ),
    ] = None,
    max_age: Annotated[
        float, typer.Option("--max-age", min=0.1, help="seconds after which it is stale")
    ] = 60.0,
) -> None:
    """Exit 0 when FILE was touched within MAX_AGE seconds, 1 when stale or missing. FILE is
    ``--file``, else ``HEARTBEAT_FILE`` (set in every pod of the chart, so ``kubectl exec
    deploy/<name>-publisher -- exportctl healthcheck`` needs no option); 2 without either."""
    if file is None:
        raise fail(
            "no heartbeat file: pass --file PATH or set HEARTBEAT_FILE (the chart's pods set "
            "it: kubectl exec deploy/<release>-publisher -- exportctl healthcheck)",
            EXIT_USAGE,
        )
    status = check(file, max_age)
    # Plain print: probe output is read by the kubelet and `kubectl describe`, not a terminal.
    print(status.message)
    if not status.fresh:
        raise typer.Exit(1)
