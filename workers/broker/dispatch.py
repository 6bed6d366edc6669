"""Dramatiq's Redis ``dispatch`` script for many calls in one write: a fan-out's enqueues
and effect tools' acks. A call is the script's own, argument for argument, as
``RedisBroker.do_<command>`` sends it. It leans on two Dramatiq internals
(``broker.scripts["dispatch"]`` and ``_max_unpack_size``), pinned by the ``dramatiq<3``
range."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from redis.exceptions import NoScriptError

from dedupe.script import pipelined

__all__ = ["calls", "run_missing"]


def calls(
    broker: RedisBroker,
    command: str,
    each: Iterable[tuple[str, Sequence[Any]]],
    *,
    maintenance: int = 0,
) -> list[list[Any]]:
    """One ``EVALSHA dispatch`` per ``(queue_name, args)``; ``maintenance`` asks the first
    call for a maintenance pass (Dramatiq rolls it per call, ``_should_do_maintenance``)."""
    dispatch = broker.scripts["dispatch"]
    unpack = broker._max_unpack_size()  # type: ignore[no-untyped-call]
    now = current_millis()
    return [
        ["EVALSHA", dispatch.sha, 1, broker.namespace, command, now, queue_name,
         broker.broker_id, broker.heartbeat_timeout, broker.dead_message_ttl,
         maintenance if i == 0 else 0, unpack, *args]
        for i, (queue_name, args) in enumerate(each)
    ]  # fmt: skip


def run_missing(
    broker: RedisBroker, conn: Any, commands: list[list[Any]], replies: list[Any]
) -> None:
    """Run again, on ``conn``, the calls a restart or ``SCRIPT FLUSH`` refused (their replies
    are ``NoScriptError``: they did not run), replacing their replies in place."""
    missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if not missing:
        return
    broker.client.script_load(broker.scripts["dispatch"].script)
    again = pipelined(conn, [commands[i] for i in missing])
    for i, reply in zip(missing, again, strict=True):
        replies[i] = reply
