"""``exportctl restore --chain ID DIR``: the state a (delta) export stands for, rebuilt from
its chain of artifacts (docs/cli.md "Verify and restore").

The chain is followed through the API from ID back to a full export by each export's
``base``; every artifact is downloaded, verified (signature, hashes) and checked to name its
base's manifest SHA-256; then applied oldest first: a note replaces its earlier version, a
tombstone removes it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from exportctl.api import DEFAULT_API_URL, ApiKey, ApiUrl, call
from exportctl.common import app, err, fail, safe
from exportctl.exports import download
from exportctl.output import OutputOpt, emit_object, explicit
from exportctl.verify import Artifact, Item, load, problems, trusted_keys


def apply_chain(chain: Sequence[Artifact]) -> dict[int, Item]:
    """``{note id: item}`` after applying ``chain`` (full export first, then its deltas in
    order). Raises ValueError when the chain is not one: the first is not a full export, a
    delta does not name the one before it, or the formats differ."""
    if not chain:
        raise ValueError("an empty chain")
    state: dict[int, Item] = {}
    for n, art in enumerate(chain):
        base = art.manifest.get("base")
        if n == 0 and base is not None:
            raise ValueError(f"export {art.manifest['export_id']} is a delta, not a full export")
        if n > 0:
            before = chain[n - 1]
            if base is None or (base.get("export_id"), base.get("manifest_sha256")) != (
                before.manifest["export_id"],
                before.manifest_sha256,
            ):
                raise ValueError(
                    f"export {art.manifest['export_id']} does not name export "
                    f"{before.manifest['export_id']}'s manifest as its base"
                )
            if art.fmt != before.fmt:
                raise ValueError("a chain is one format")
        if base is None:
            state = {}
        for item in art.items:
            if item.deleted:
                state.pop(item.id, None)
            else:
                state[item.id] = item
    return state


def write_state(chain: Sequence[Artifact], state: dict[int, Item], target: Path) -> dict[str, Any]:
    """Write ``notes.ndjson`` (or ``notes/*.md`` for markdown_zip) and ``chain.json``;
    returns what ``chain.json`` holds (``{"chain": [...], "notes": n}``)."""
    target.mkdir(parents=True, exist_ok=True)
    if chain[-1].fmt == "markdown_zip":
        for item in sorted(state.values(), key=lambda i: i.id):
            assert item.record is not None
            path = target / item.record["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(item.data)
    else:
        with open(target / "notes.ndjson", "wb") as fh:
            for item in sorted(state.values(), key=lambda i: i.id):
                fh.write(item.data + b"\n")
    summary = {
        "chain": [
            {
                "export_id": a.manifest["export_id"],
                "kind": a.manifest["kind"],
                "manifest_sha256": a.manifest_sha256,
                "notes": a.manifest["notes"],
                "tombstones": a.manifest["tombstones"],
            }
            for a in chain
        ],
        "notes": len(state),
    }
    (target / "chain.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    return summary


@app.command()
def restore(
    chain: Annotated[str, typer.Option("--chain", help="the newest export of the chain")],
    target: Path,
    allow_unsigned: Annotated[
        bool, typer.Option("--allow-unsigned", help="accept manifests without signature")
    ] = False,
    api_url: ApiUrl = DEFAULT_API_URL,
    api_key: ApiKey = "",
    output: OutputOpt = None,
) -> None:
    """Rebuild the notes an export stands for from its chain (full export + deltas) into
    the folder TARGET (new or empty). ``--output json`` prints what ``chain.json`` holds."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise fail(f"{target} exists and is not an empty folder", 2)
    ids: list[str] = []
    job: dict[str, Any] = call(api_url, api_key, "GET", f"/v1/exports/{chain}")
    while True:
        ids.append(str(job["id"]))
        if job["status"] != "succeeded":
            raise fail(f"export {job['id']} of the chain is {job['status']}, not succeeded")
        if not job.get("base"):
            break
        if len(ids) > 10_000:
            raise fail("the chain is longer than 10000 exports")
        job = call(api_url, api_key, "GET", f"/v1/exports/{job['base']['id']}")
    ids.reverse()
    keys = trusted_keys(api_url, None, None)
    arts: list[Artifact] = []
    with tempfile.TemporaryDirectory(prefix="exportctl-restore-") as tmp:
        for job_id in ids:
            path = Path(tmp) / f"export-{job_id}"
            download(job_id, str(path), True, api_url, api_key)
            art = load(path)
            wrong = problems(art, keys, allow_unsigned=allow_unsigned)
            if wrong:
                raise fail(f"export {job_id} does not verify: " + "; ".join(wrong))
            arts.append(art)
    try:
        state = apply_chain(arts)
    except ValueError as exc:
        raise fail(str(exc)) from None
    summary = write_state(arts, state, target)
    emit_object(
        summary,
        explicit(output),
        default=lambda _: err.print(
            f"[green]restored[/] {len(state)} notes from {len(arts)} exports into {safe(target)}"
        ),
    )
