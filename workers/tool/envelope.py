"""What an effect message carries: the envelope (its one positional argument) and the
ledger's time of its submission (a message option). The producer and the campaign fan-out
write both; the worker path reads them back (``workers.tool``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import dramatiq
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
)

from dedupe import Effect, MessageError
from dedupe.identity import EFFECT_KEY

__all__ = ["SUBMITTED_MS", "Envelope", "submitted_ms"]

# The message option carrying the ledger's time (ms) when the message was submitted: its
# age against the provider's window is judged on the ledger's clock, never a producer's.
# An option, not an envelope field: a worker of the previous release (envelope
# extra="forbid") ignores it during a rolling upgrade.
SUBMITTED_MS = "effectq_submitted_ms"


class Envelope(BaseModel):
    """The one positional argument of every effect message."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    v: Literal[1]
    key: Annotated[str, StringConstraints(pattern=f"^{EFFECT_KEY.pattern}$")]
    scope: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    action: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    args: dict[str, JsonValue]
    campaign: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16}$")] | None = None
    # The generation the message was submitted for (the ledger's submit answer): after a
    # revoke, only a message submitted later opens the next generation.
    g: Annotated[int, Field(ge=0)] = 0

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Leave the optional fields out at their defaults: a worker of the previous release
        # (extra="forbid", no `g`) still accepts every message but a post-revoke submission
        # during a rolling upgrade.
        data: dict[str, Any] = handler(self)
        if data.get("g") == 0:
            del data["g"]
        if data.get("campaign") is None:
            data.pop("campaign", None)
        return data

    @classmethod
    def of(cls, effect: Effect, campaign: str | None = None, generation: int = 0) -> Envelope:
        return cls(
            v=1, key=effect.key, scope=effect.scope, action=effect.action,
            args=dict(effect.args), campaign=campaign, g=generation,
        )  # fmt: skip


def submitted_ms(message: dramatiq.Message[Any] | None, key: str) -> int:
    """The ledger's time at the message's submission (``SUBMITTED_MS``). A message of the
    previous release has none: its producer's ``message_timestamp`` stands in, as it did
    then (one release; UPGRADING). A direct call (no message): 0, not judged."""
    if message is None:
        return 0
    stamp = message.options.get(SUBMITTED_MS)
    if stamp is None:
        return int(message.message_timestamp)
    if type(stamp) is not int or stamp <= 0:
        raise MessageError(f"invalid {SUBMITTED_MS} option: not a positive integer", key=key)
    return stamp
