"""Artifact storage: one interface, two backends (``file://`` and ``s3://``).

``open_store(settings)`` returns the store that ``ARTIFACT_URL`` (or, when it is empty,
``ARTIFACT_DIR``) names. Import everything from here::

    from exportcore.artifacts import ArtifactStore, artifact_key, open_store

The S3 backend (and boto3) is imported only when an ``s3://`` store is opened, or when
``S3ArtifactStore`` / ``S3Config`` is imported from this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exportcore.artifacts.base import (
    ArtifactEntry,
    ArtifactStore,
    ArtifactWriter,
    CheckpointUntrusted,
    DurablePrefix,
    StoredArtifact,
    artifact_key,
    is_artifact_key,
    key_prefix,
    missing_counts,
    record_missing,
    validate_key,
)
from exportcore.artifacts.file import TEMP_SUFFIX, FileArtifactStore
from exportcore.artifacts.location import ArtifactLocation, parse_artifact_url

if TYPE_CHECKING:
    from exportcore.artifacts.s3 import S3ArtifactStore, S3Config
    from exportcore.downstream import DownstreamLimiter
    from exportcore.settings import Settings

__all__ = [
    "TEMP_SUFFIX",
    "ArtifactEntry",
    "ArtifactLocation",
    "ArtifactStore",
    "ArtifactWriter",
    "CheckpointUntrusted",
    "DurablePrefix",
    "FileArtifactStore",
    "S3ArtifactStore",
    "S3Config",
    "StoredArtifact",
    "artifact_key",
    "is_artifact_key",
    "key_prefix",
    "missing_counts",
    "open_store",
    "parse_artifact_url",
    "record_missing",
    "validate_key",
]


def open_store(settings: Settings, downstream: DownstreamLimiter | None = None) -> ArtifactStore:
    """The artifact store the settings name (``ARTIFACT_URL``, else ``ARTIFACT_DIR``).
    ``downstream`` (a worker's) limits the calls of an object store to the deployment's
    storage rate (:mod:`exportcore.downstream`); a folder has no shared service to protect."""
    location = settings.artifact_location()
    if location.scheme == "file":
        assert location.path is not None
        return FileArtifactStore(location.path)
    from exportcore.artifacts.s3 import S3ArtifactStore, S3Config

    return S3ArtifactStore(S3Config.from_settings(settings, location), downstream)


def __getattr__(name: str) -> object:
    if name in ("S3ArtifactStore", "S3Config"):
        from exportcore.artifacts import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
