"""Where the broker reports a message that never became one, and how it says why."""

from __future__ import annotations

import hashlib
import logging
from typing import Protocol

__all__ = ["UNDECODABLE", "DeadLetterSink", "undecodable", "undecodable_id"]

log = logging.getLogger("effectq.broker")

# The ``tool`` field of a dead-letter record for bytes that never became a message.
UNDECODABLE = "(undecodable)"


class DeadLetterSink(Protocol):
    """Records why a message died (``Runtime.record_dead_letter``); never raises."""

    def __call__(
        self, *, message_id: str, tool: str, key: str | None, reason: str, kind: str
    ) -> None: ...


def undecodable(sink: DeadLetterSink, message_id: str, error: BaseException, size: int) -> None:
    # The exception's class only: its text can quote the bytes (a recipient, a secret).
    reason = f"undecodable message ({type(error).__name__}, {size} bytes): never executed"
    sink(message_id=message_id, tool=UNDECODABLE, key=None, reason=reason, kind="undecodable")
    log.warning("dead-lettered %s: %s", message_id, reason)


def undecodable_id(data: bytes) -> str:
    """The record's message id for bytes that never became a message on RabbitMQ (the id
    is not in the bytes, so the record names their digest)."""
    return f"sha256:{hashlib.sha256(data).hexdigest()[:32]}"
