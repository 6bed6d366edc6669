"""Dramatiq's Redis key names, spelled once (its Redis broker's layout, pinned by
``dramatiq<3``): the consumer that dead-letters undecodable bytes and the metrics' queue
depths read them."""

from __future__ import annotations

__all__ = ["NAMESPACE", "ack_set", "queue_hash"]

#: Dramatiq's default Redis namespace, which effectq keeps.
NAMESPACE = "dramatiq"


def queue_hash(queue: str, namespace: str = NAMESPACE) -> str:
    """The hash of a queue's message bodies by message id (``<queue>.DQ`` for the delay
    queue, ``<queue>.XQ`` for the dead letters)."""
    return f"{namespace}:{queue}.msgs"


def ack_set(queue: str, broker_id: str, namespace: str = NAMESPACE) -> str:
    """The ids one worker process fetched from ``queue`` and has not acked yet."""
    return f"{namespace}:__acks__.{broker_id}.{queue}"
