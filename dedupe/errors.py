"""The one error tree of effectq.

::

    EffectqError                  (message, details)
    ├── IdentityError             the arguments cannot name an effect
    │   ├── CanonicalizationError     a value has no canonical form (NaN, float money, bad key…)
    │   │   └── InvisibleCharacterError   an identity value holds a control, format, invisible
    │   │                                 (default-ignorable), unassigned or private-use character
    │   ├── MissingFieldError         an identity or bound field is absent
    │   ├── ValueTooLargeError        a value is over its size bound (money's digits too)
    │   ├── KeyFormatError            an effect key is not 64 lowercase hex digits
    │   └── SpecError                 a tool declaration contradicts itself
    ├── LedgerError               the ledger cannot answer or refused a write
    │   ├── LedgerUnavailableError    Redis did not answer: fail closed, execute nothing
    │   ├── LedgerAuthError           Redis refused the credentials (a configuration error)
    │   ├── LedgerConfigError         the ledger's options cannot work: a client that would
    │   │                             not read replies as UTF-8, a namespace, bucket count,
    │   │                             bound or WAIT setting out of range (also a ValueError)
    │   ├── VolatileLedgerError       Redis has no AOF and volatility was not allowed
    │   ├── LayoutChangedError        the namespace or bucket count differs from the ledger's
    │   ├── RecordTooLargeError       a receipt / raw response / request is over its bound
    │   └── TransitionRefusedError    the state table forbids this transition (carries state)
    │   └── LedgerRefused*            a worker process refuses to consume (also Dramatiq's
    │                                 MiddlewareError, so Dramatiq stops the process)
    ├── MessageError              a queue message is malformed: dead-letter it, never execute
    │   ├── StaleMessageError         older than the provider's idempotency window
    │   └── ToolsModuleError*         the tools module (EFFECTQ_TOOLS) cannot be imported
    ├── OperatorError             an operator action lacks an actor, a reason or its evidence
    │   └── NotFoundError             no effect has this key
    │       └── CampaignNotFoundError     no campaign (or no job of it) has this id
    ├── ConflictError             same effect key, different bound fields
    ├── ProviderError             a provider call failed: uncertain unless it says otherwise
    │   └── NotExecutedError          definitely not executed (refused before acting): retry
    │       └── RejectedError         not executed and never will be (4xx): dead-letter
    ├── WaitTimeout               a producer's wait ended before the effect was DONE
    └── RetryLater*               control flow on the worker path: the message stays alive
                                  (also Dramatiq's Retry)

    RuntimeError
    └── FailpointError            a ``raise`` failpoint fired (``dedupe.failpoints``): outside
                                  the tree on purpose, so that it acts like a crash

``*``: defined where it is raised, in ``workers`` (``workers.broker.middleware``,
``workers.registry``, ``workers.tool``), since they are about Dramatiq; the rest is here,
importable without Dramatiq.

``CODES`` below is the one table of what each error answers: the CLI's exit code, the
API's HTTP status and body ``error``. The CLI (``workers.cli._app``), the API
(``workers.api.problems``) and README's table read it; an error defined in ``workers``
answers as its nearest ancestor here.

Errors carry the effect key and state, never a raw recipient. An IdentityError's message
names the tool and field, never the value it refuses (nor a malformed key).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "CODES",
    "CampaignNotFoundError",
    "CanonicalizationError",
    "Code",
    "ConflictError",
    "EffectqError",
    "IdentityError",
    "InvisibleCharacterError",
    "KeyFormatError",
    "LayoutChangedError",
    "LedgerAuthError",
    "LedgerConfigError",
    "LedgerError",
    "LedgerUnavailableError",
    "MessageError",
    "MissingFieldError",
    "NotExecutedError",
    "NotFoundError",
    "OperatorError",
    "ProviderError",
    "RecordTooLargeError",
    "RejectedError",
    "SpecError",
    "StaleMessageError",
    "TransitionRefusedError",
    "ValueTooLargeError",
    "VolatileLedgerError",
    "WaitTimeout",
    "code_of",
]


class EffectqError(Exception):
    """Base of every effectq error: a message and a dict of safe details."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    @property
    def key(self) -> str | None:
        value = self.details.get("key")
        return value if isinstance(value, str) else None


class IdentityError(EffectqError):
    pass


class CanonicalizationError(IdentityError):
    pass


class InvisibleCharacterError(CanonicalizationError):
    """An identity value (an identity field, scope, campaign id or recipient) holds a
    character that would make one target look like two (``dedupe.normalize.visible``)."""


class MissingFieldError(IdentityError):
    pass


class ValueTooLargeError(IdentityError):
    pass


class KeyFormatError(IdentityError):
    pass


class SpecError(IdentityError):
    pass


class LedgerError(EffectqError):
    pass


class LedgerUnavailableError(LedgerError):
    pass


class LedgerAuthError(LedgerError):
    pass


class LedgerConfigError(LedgerError, ValueError):
    """The ledger's options cannot work: its Redis client (given, or made from its URL)
    would not read replies as UTF-8, or a namespace, bucket count, bound or WAIT setting
    is out of range. A ValueError too, as a bad argument is."""


class VolatileLedgerError(LedgerError):
    pass


class LayoutChangedError(LedgerError):
    """The ledger holds records of another namespace or bucket count: refused at start."""


class RecordTooLargeError(LedgerError):
    pass


class TransitionRefusedError(LedgerError):
    """The state table forbids the transition; ``details['state']`` is the current state."""

    @property
    def state(self) -> str | None:
        value = self.details.get("state")
        return value if isinstance(value, str) else None


class MessageError(EffectqError):
    pass


class StaleMessageError(MessageError):
    """The message outlived its provider's idempotency window: executing it now could be a
    second effect at a provider that forgot the key."""


class OperatorError(EffectqError):
    pass


class NotFoundError(OperatorError):
    """No effect has this key (it never existed, or its settled record expired)."""


class CampaignNotFoundError(NotFoundError):
    """No campaign has this id (never planned, or its plan expired), or no job of it."""


class ConflictError(EffectqError):
    pass


class ProviderError(EffectqError):
    pass


class NotExecutedError(ProviderError):
    """Raised by a tool when the provider certainly did not act (connection refused, a
    documented pre-execution 503). The ledger records FAILED and the message is retried."""


class RejectedError(NotExecutedError):
    """The provider refused the request outright; retrying cannot help."""


class WaitTimeout(EffectqError):
    """The effect did not reach DONE in time; ``details['state']`` says where it is."""


class Code(NamedTuple):
    """What one error answers."""

    #: The CLI's exit code.
    exit: int
    #: The API's HTTP status.
    status: int
    #: The API body's ``error``.
    kind: str
    #: The API's fixed message in place of the error's own, where that could name a key,
    #: a Redis address or a bug.
    says: str | None = None


_UNAVAILABLE = "the ledger is unavailable; nothing was done"
_INVALID = Code(2, 422, "invalid")
_LEDGER = Code(2, 503, "unavailable", _UNAVAILABLE)  # nothing done; the server's log says why
_INTERNAL = Code(2, 500, "internal", "internal error")  # not an API caller's doing

#: Every error of the tree, in the tree's order.
CODES: dict[type[EffectqError], Code] = {
    EffectqError: _INTERNAL,
    IdentityError: _INVALID,
    CanonicalizationError: _INVALID,
    InvisibleCharacterError: _INVALID,
    MissingFieldError: _INVALID,
    ValueTooLargeError: _INVALID,
    KeyFormatError: _INVALID,
    SpecError: _INVALID,
    LedgerError: _LEDGER,
    LedgerUnavailableError: Code(7, 503, "unavailable", _UNAVAILABLE),
    LedgerAuthError: _LEDGER,
    LedgerConfigError: _LEDGER,
    VolatileLedgerError: _LEDGER,
    LayoutChangedError: _LEDGER,
    RecordTooLargeError: Code(2, 413, "too_large"),
    TransitionRefusedError: Code(8, 409, "refused"),
    MessageError: _INVALID,
    StaleMessageError: _INVALID,
    OperatorError: _INVALID,
    NotFoundError: Code(6, 404, "not_found", "no effect with this key"),
    CampaignNotFoundError: Code(6, 404, "not_found", "no such campaign"),
    ConflictError: Code(3, 409, "conflict"),
    ProviderError: _INTERNAL,
    NotExecutedError: _INTERNAL,
    RejectedError: _INTERNAL,
    WaitTimeout: Code(5, 500, "internal", "internal error"),
}


def code_of(exc: EffectqError) -> Code:
    """The row of ``exc``'s class, or of its nearest ancestor in ``CODES``."""
    return next(code for cls in type(exc).__mro__ if (code := CODES.get(cls)) is not None)
