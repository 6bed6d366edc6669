"""Effect identity and the fenced claim ledger on Redis. No Dramatiq here."""

from .canonical import canonical_bytes
from .errors import (
    CanonicalizationError,
    ConflictError,
    EffectqError,
    IdentityError,
    LedgerError,
    LedgerUnavailableError,
    MessageError,
    MissingFieldError,
    ProviderError,
    RecordTooLargeError,
    SpecError,
    TransitionRefusedError,
    ValueTooLargeError,
    VolatileLedgerError,
)
from .identity import Effect, derive, idempotency_key
from .ledger import Ledger
from .records import Claim, ClaimOutcome, EffectRecord, State, Takeover, Transition, Write
from .spec import Found, Lookup, LookupResult, NotFound, ToolSpec, Unavailable

__all__ = [
    "CanonicalizationError",
    "Claim",
    "ClaimOutcome",
    "ConflictError",
    "Effect",
    "EffectRecord",
    "EffectqError",
    "Found",
    "IdentityError",
    "Ledger",
    "LedgerError",
    "LedgerUnavailableError",
    "Lookup",
    "LookupResult",
    "MessageError",
    "MissingFieldError",
    "NotFound",
    "ProviderError",
    "RecordTooLargeError",
    "SpecError",
    "State",
    "Takeover",
    "ToolSpec",
    "Transition",
    "TransitionRefusedError",
    "Unavailable",
    "ValueTooLargeError",
    "VolatileLedgerError",
    "Write",
    "canonical_bytes",
    "derive",
    "idempotency_key",
]
