"""Dramatiq's RabbitMQ broker as effectq runs it (docs/rabbitmq.md): publisher confirms,
the AMQP heartbeat from the heartbeat timeout, and undecodable deliveries recorded before
Dramatiq's consumer rejects them to ``<queue>.XQ``."""

from __future__ import annotations

import math
from urllib.parse import parse_qsl, urlsplit

import dramatiq
from dramatiq.encoder import JSONEncoder, MessageData

from ..settings import Settings
from .dead_letters import DeadLetterSink, undecodable, undecodable_id

__all__ = ["build_rabbitmq_broker"]


class _RecordingEncoder(JSONEncoder):
    """For RabbitMQ, which rejects an undecodable delivery itself: record it first."""

    def __init__(self, dead_letter: DeadLetterSink) -> None:
        self._dead_letter = dead_letter

    def decode(self, data: bytes) -> MessageData:
        try:
            fields = super().decode(data)
            # What ``Message.decode`` does with the fields next: JSON that is not a message
            # (a list, missing or unknown fields) is just as undecodable.
            dramatiq.Message(**{**fields, "args": tuple(fields["args"])})
        except Exception as exc:
            undecodable(self._dead_letter, undecodable_id(data), exc, len(data))
            raise
        return fields


def _amqp_url(cfg: Settings) -> str:
    """The broker URL (or ``;``-separated URLs) with the AMQP heartbeat set from the
    heartbeat timeout where a URL sets none: RabbitMQ requeues a connection's unacked
    messages once it misses heartbeats for that long (a SIGKILLed worker's at once: its
    socket closes)."""
    seconds = max(1, math.ceil(cfg.broker_heartbeat_timeout_ms / 1000))
    urls = []
    for url in cfg.broker_url.split(";"):
        query = urlsplit(url).query
        if not any(name == "heartbeat" for name, _ in parse_qsl(query)):
            url = f"{url}{'&' if query else '?'}heartbeat={seconds}"
        urls.append(url)
    return ";".join(urls)


def build_rabbitmq_broker(cfg: Settings, dead_letter: DeadLetterSink) -> dramatiq.Broker:
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    # Dramatiq's encoder is process-global; RabbitMQ decodes deliveries with it.
    dramatiq.set_encoder(_RecordingEncoder(dead_letter))
    return RabbitmqBroker(url=_amqp_url(cfg), confirm_delivery=True)
