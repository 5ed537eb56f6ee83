"""Pure parts of the broker inspection: kombu's key names and message envelopes (the Redis
side is in tests/integration/test_broker_inspect.py)."""

from __future__ import annotations

import base64
import json
from uuid import uuid4

from kombu.transport.redis import Channel

from exportcore.broker import EXPORT_TASK, TICK_TASK
from exportcore.broker_inspect import BrokerKeys, parse_message


def envelope(task: str, args: list[object], encode: bool = True) -> bytes:
    body = json.dumps([args, {}, {}])
    return json.dumps(
        {
            "body": base64.b64encode(body.encode()).decode() if encode else body,
            "headers": {"task": task, "id": str(uuid4())},
            "properties": {"body_encoding": "base64"} if encode else {},
        }
    ).encode()


def test_keys_follow_kombus_channel() -> None:
    keys = BrokerKeys()
    assert (keys.unacked, keys.unacked_index) == (Channel.unacked_key, Channel.unacked_index_key)
    assert keys.lists("exports.fast") == [
        "exports.fast",
        f"exports.fast{Channel.sep}3",
        f"exports.fast{Channel.sep}6",
        f"exports.fast{Channel.sep}9",
    ]
    prefixed = BrokerKeys({"global_keyprefix": "prod:"})
    assert prefixed.unacked == "prod:unacked" and prefixed.lists("q")[0] == "prod:q"


def test_messages_name_their_job_or_are_ticks_or_unreadable() -> None:
    job_id = uuid4()
    m = parse_message("exports.fast", "ready", envelope(EXPORT_TASK, [str(job_id)]))
    assert (m.verdict, m.job_id, m.task) == ("live", job_id, EXPORT_TASK) and m.task_id
    plain = parse_message("exports.fast", "ready", envelope(EXPORT_TASK, [str(job_id)], False))
    assert plain.job_id == job_id
    tick = parse_message("exports.fast", "ready", envelope(TICK_TASK, []))
    assert tick.verdict == "tick" and tick.job_id is None
    for raw in (
        b"not json",
        b"[]",
        envelope(EXPORT_TASK, []),
        envelope(EXPORT_TASK, ["not-a-uuid"]),
        envelope("someone.else", [str(job_id)]),
        json.dumps({"headers": {"task": EXPORT_TASK}, "body": "%%%"}).encode(),
    ):
        assert parse_message("q", "unacked", raw).verdict == "unreadable", raw
