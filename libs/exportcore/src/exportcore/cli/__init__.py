"""``exportctl``: the operator's command line (typer + rich)."""
