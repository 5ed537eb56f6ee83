"""Profiles: the API URL and keys of each place ``exportctl`` talks to, in one config file
(docs/cli.md, "Profiles").

The file is ``$XDG_CONFIG_HOME/exportctl/config.toml`` (``~/.config/exportctl/config.toml``
when ``XDG_CONFIG_HOME`` is unset; XDG Base Directory Specification), or ``EXPORTCTL_CONFIG``:

.. code-block:: toml

    default = "local"

    [profiles.local]
    api_url = "http://127.0.0.1:8000"
    api_key = "nex_…"
    operator_key = "nex_op_…"

    [profiles.prod]
    api_url = "https://exports.example.com"
    operator_key = "nex_op_…"
    database_url = "postgresql://…"
    output = "json"

``exportctl --profile prod …`` (or ``EXPORTCTL_PROFILE=prod``) picks one, else ``default``.
The environment still wins: ``API_URL``, ``API_KEY``, ``OPERATOR_KEY``, ``DATABASE_URL`` and
``EXPORTCTL_OUTPUT`` override the profile, and an option on the command line overrides both.
The file holds keys: it should be readable by its owner only (a warning says so otherwise).
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from exportctl.common import app, err, safe
from exportctl.exits import EXIT_USAGE

FIELDS = ("api_url", "api_key", "operator_key", "database_url", "output")
"""What a profile may set."""


@dataclass(frozen=True)
class Profile:
    """One profile's settings (each optional) and where they came from."""

    name: str | None = None
    path: Path | None = None
    api_url: str | None = None
    api_key: str | None = None
    operator_key: str | None = None
    database_url: str | None = None
    output: str | None = None


_active = Profile()


def config_path() -> Path:
    """``EXPORTCTL_CONFIG``, else ``$XDG_CONFIG_HOME/exportctl/config.toml`` (XDG Base
    Directory Specification: ``~/.config`` when the variable is unset or empty)."""
    if explicit := os.environ.get("EXPORTCTL_CONFIG"):
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "exportctl" / "config.toml"


def load(name: str | None, path: Path | None = None) -> Profile:
    """The profile ``name`` (or the file's ``default``; none at all without a file) of the
    config file. Raises the CLI usage error for a file that does not parse, a profile that
    does not exist, or an unknown field."""
    path = path or config_path()
    if not path.is_file():
        if name:
            raise _usage(f"no config file {path} for --profile {name}; see docs/cli.md")
        return Profile()
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _usage(f"cannot read {path}: {exc}") from None
    _warn_if_readable(path)
    profiles = data.get("profiles", {})
    chosen = name or data.get("default")
    if chosen is None:
        return Profile(path=path)
    if not isinstance(profiles, dict) or chosen not in profiles:
        known = ", ".join(sorted(profiles)) if isinstance(profiles, dict) else ""
        raise _usage(f"no profile {chosen!r} in {path} (profiles: {known or 'none'})")
    values = profiles[chosen]
    unknown = sorted(set(values) - set(FIELDS))
    if unknown:
        raise _usage(
            f"profile {chosen!r} of {path}: unknown {', '.join(unknown)}; "
            f"known: {', '.join(FIELDS)}"
        )
    return Profile(name=chosen, path=path, **{k: str(v) for k, v in values.items()})


def _usage(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {safe(message)}")
    return typer.Exit(EXIT_USAGE)


def _warn_if_readable(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        err.print(
            f"[yellow]warning:[/] {safe(path)} holds keys and is readable by others: "
            f"chmod 600 {safe(path)}"
        )


def active() -> Profile:
    """The profile of this command line (:func:`use`)."""
    return _active


def use(profile: Profile) -> None:
    """Make ``profile`` the active one; its ``database_url`` applies where ``DATABASE_URL``
    is unset (the environment wins)."""
    global _active
    _active = profile
    if profile.database_url and not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = profile.database_url


@app.callback()
def main(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            envvar="EXPORTCTL_PROFILE",
            help="a profile of the config file (~/.config/exportctl/config.toml): API URL "
            "and keys; the environment still wins",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Operate notes-exports: migrate, manage tenants and keys, import notes, run exports."""
    use(load(profile))
