"""``exportctl healthcheck``: the heartbeat check for a person (the chart's exec probes run the
same check as ``python -m exportcore.liveness``, which loads no more than the standard
library)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from exportcore.liveness import check
from exportctl.common import app


@app.command()
def healthcheck(
    file: Annotated[
        Path,
        typer.Option(
            "--file",
            envvar="HEARTBEAT_FILE",
            help="the heartbeat file the process touches (env HEARTBEAT_FILE)",
            show_default=False,
        ),
    ],
    max_age: Annotated[
        float, typer.Option("--max-age", min=0.1, help="seconds after which it is stale")
    ] = 60.0,
) -> None:
    """Exit 0 when FILE was touched within MAX_AGE seconds, 1 when stale or missing."""
    status = check(file, max_age)
    # Plain print: probe output is read by the kubelet and `kubectl describe`, not a terminal.
    print(status.message)
    if not status.fresh:
        raise typer.Exit(1)
