"""The audit trail: who did what to which target, when, and how it ended (``operator_actions``,
migration 0015).

Every change an operator, a tenant or a database user makes through notes-exports — a
replay, a resolution, a cancel, a pause, a resume, a run now, a purge, a key change, a bulk
action, a webhook change — calls :func:`record` on the connection of the change's own
transaction, so the row commits with the change or not at all: the row is there, or the
action did not happen. A bulk action records one row when it starts and each of its batches
advances that row's count in the batch's transaction (:func:`advance`).

The actor is named the way people recognise it: an operator key's prefix and label
(``nex_op_1a2b3c4d (alice)``), a tenant key's prefix and label with its tenant, or, for
commands run with database access (``exportctl operator-key create``), the operating-system
user and host (``exportctl as alice@bastion``): such commands have no key to name.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from exportcore.auth import AuthContext
from exportcore.db import Conn, Row
from exportcore.store import operator_actions as action_store

ActorKind = Literal["operator", "tenant", "database", "system"]


@dataclass(frozen=True)
class Actor:
    """Who acts: ``kind`` (an operator key, a tenant key, a database user, the system
    itself), ``name`` as records show it, the key's id (``key_id``, None without a key)
    and, for a tenant key, its ``tenant_id``."""

    kind: ActorKind
    name: str
    key_id: UUID | None = None
    tenant_id: str | None = None

    @classmethod
    def of(cls, ctx: AuthContext) -> Actor:
        """The actor of an authenticated key (an operator's or a tenant's)."""
        return cls(
            kind="operator" if ctx.is_operator else "tenant",
            name=ctx.actor or str(ctx.key_id),
            key_id=ctx.key_id,
            tenant_id=ctx.tenant_id,
        )

    @classmethod
    def database(cls) -> Actor:
        """The person running an ``exportctl`` database command: the operating-system user
        and the host (``exportctl as alice@bastion``), the best name such a command has."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry for the uid (a container)
            user = "unknown"
        return cls(kind="database", name=f"exportctl as {user}@{socket.gethostname()}"[:300])

    @property
    def requested_by(self) -> str:
        """What a job's history (which its tenant reads) says about who asked: ``tenant``
        or ``operator``; never an operator key's name."""
        return "tenant" if self.kind == "tenant" else "operator"


SYSTEM = Actor(kind="system", name="notes-exports")
"""The actor of changes nobody asked for in person (library calls, tests)."""


def as_actor(value: Actor | str) -> Actor:
    """``value`` as an :class:`Actor`: a bare name (how callers named who acted before the
    audit trail, e.g. ``AuthContext.actor``) is a ``system`` actor of that name."""
    return value if isinstance(value, Actor) else Actor(kind="system", name=value or "unknown")


def record(
    conn: Conn,
    actor: Actor,
    action: str,
    *,
    target_kind: str,
    target_id: object | None = None,
    tenant_id: str | None = None,
    job_id: UUID | None = None,
    filter: dict[str, Any] | None = None,
    count: int | None = None,
    outcome: str = "done",
    detail: dict[str, Any] | None = None,
) -> Row:
    """Append the audit row of ``action`` (``replay``, ``cancel``, ``bulk_replay``…) on
    ``target_kind`` / ``target_id`` by ``actor``, on ``conn`` — which must be the
    connection of the action's own transaction. ``tenant_id`` is whose target it is (the
    actor's tenant for a tenant key), ``job_id`` the job it concerns (its timeline shows
    the row), ``filter`` and ``count`` those of a bulk action, ``outcome`` how it ended
    (``done``, ``existing``, ``refused``, ``running``…). Returns the row."""
    return action_store.operator_action_insert(
        conn,
        actor_kind=actor.kind,
        key_id=actor.key_id,
        actor=actor.name[:300] or "unknown",
        action=action,
        target_kind=target_kind,
        target_id=None if target_id is None else str(target_id),
        tenant_id=tenant_id or actor.tenant_id,
        job_id=job_id,
        filter=filter,
        count=count,
        outcome=outcome,
        detail=detail or {},
    )


def advance(
    conn: Conn, action_id: int, *, count: int, outcome: str, detail: dict[str, Any]
) -> None:
    """A bulk action's audit row after one of its batches (on the batch's connection): the
    targets acted on so far, its outcome (``running``, ``done``, ``stopped``) and progress
    counters merged into ``detail``."""
    action_store.operator_action_set_progress(
        conn, action_id=action_id, count=count, outcome=outcome, detail=detail
    )
