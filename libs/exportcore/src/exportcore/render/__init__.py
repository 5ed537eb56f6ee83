"""Streaming renderers: each format writes chunk by chunk to a binary sink, never holding
the whole export in memory.

A renderer is driven as ``begin(header)``, ``add(notes)`` once per chunk, ``end()``; every
artifact ends with its manifest (:mod:`exportcore.manifests`), and a render can be resumed
from checkpoint segments (:meth:`Renderer.resume`).
"""

from __future__ import annotations

from exportcore.domain import ExportFormat
from exportcore.manifests import Signer
from exportcore.render.base import ExportHeader, NoteRecord, Renderer, Sink
from exportcore.render.jsonfmt import JsonRenderer, NdjsonRenderer
from exportcore.render.markdown_zip import MarkdownZipRenderer

__all__ = ["ExportHeader", "NoteRecord", "Renderer", "Sink", "make_renderer"]


def make_renderer(fmt: ExportFormat, out: Sink, signer: Signer | None = None) -> Renderer:
    """The renderer for ``fmt`` writing to ``out`` (``write``, ``tell``, ``flush``); its
    manifest is signed by ``signer`` (unsigned without one)."""
    if fmt is ExportFormat.JSON:
        return JsonRenderer(out, signer)
    if fmt is ExportFormat.NDJSON:
        return NdjsonRenderer(out, signer)
    if fmt is ExportFormat.MARKDOWN_ZIP:
        return MarkdownZipRenderer(out, signer)
    raise ValueError(f"unsupported format {fmt!r}")
