"""Effect identity and the fenced claim ledger on Redis. No Dramatiq here.

The names below are imported on first use (PEP 562), as in ``workers`` and ``reconciler``:
a process that needs one module (the CLI's ``--help``, a submodule) loads only that one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .campaigns import CampaignPlan as CampaignPlan
    from .campaigns import CampaignStore as CampaignStore
    from .campaigns import campaign_tag as campaign_tag
    from .canonical import canonical_bytes as canonical_bytes
    from .errors import CampaignNotFoundError as CampaignNotFoundError
    from .errors import CanonicalizationError as CanonicalizationError
    from .errors import ConflictError as ConflictError
    from .errors import EffectqError as EffectqError
    from .errors import IdentityError as IdentityError
    from .errors import KeyFormatError as KeyFormatError
    from .errors import LayoutChangedError as LayoutChangedError
    from .errors import LedgerAuthError as LedgerAuthError
    from .errors import LedgerConfigError as LedgerConfigError
    from .errors import LedgerError as LedgerError
    from .errors import LedgerUnavailableError as LedgerUnavailableError
    from .errors import MessageError as MessageError
    from .errors import MissingFieldError as MissingFieldError
    from .errors import NotExecutedError as NotExecutedError
    from .errors import NotFoundError as NotFoundError
    from .errors import OperatorError as OperatorError
    from .errors import ProviderError as ProviderError
    from .errors import RecordTooLargeError as RecordTooLargeError
    from .errors import RejectedError as RejectedError
    from .errors import SpecError as SpecError
    from .errors import StaleMessageError as StaleMessageError
    from .errors import TransitionRefusedError as TransitionRefusedError
    from .errors import ValueTooLargeError as ValueTooLargeError
    from .errors import VolatileLedgerError as VolatileLedgerError
    from .errors import WaitTimeout as WaitTimeout
    from .identity import Effect as Effect
    from .identity import derive as derive
    from .identity import idempotency_key as idempotency_key
    from .ledger import Ledger as Ledger
    from .records import Claim as Claim
    from .records import ClaimOutcome as ClaimOutcome
    from .records import EffectRecord as EffectRecord
    from .records import State as State
    from .records import Submission as Submission
    from .records import SubmitStatus as SubmitStatus
    from .records import Takeover as Takeover
    from .records import Transition as Transition
    from .records import Write as Write
    from .spec import Found as Found
    from .spec import Lookup as Lookup
    from .spec import LookupResult as LookupResult
    from .spec import NotFound as NotFound
    from .spec import ToolSpec as ToolSpec
    from .spec import Unavailable as Unavailable

_WHERE = {
    "CampaignPlan": "campaigns",
    "CampaignStore": "campaigns",
    "CampaignNotFoundError": "errors",
    "CanonicalizationError": "errors",
    "Claim": "records",
    "ClaimOutcome": "records",
    "ConflictError": "errors",
    "Effect": "identity",
    "EffectRecord": "records",
    "EffectqError": "errors",
    "Found": "spec",
    "IdentityError": "errors",
    "KeyFormatError": "errors",
    "Ledger": "ledger",
    "LayoutChangedError": "errors",
    "LedgerAuthError": "errors",
    "LedgerConfigError": "errors",
    "LedgerError": "errors",
    "LedgerUnavailableError": "errors",
    "Lookup": "spec",
    "LookupResult": "spec",
    "MessageError": "errors",
    "MissingFieldError": "errors",
    "NotExecutedError": "errors",
    "NotFound": "spec",
    "NotFoundError": "errors",
    "OperatorError": "errors",
    "ProviderError": "errors",
    "RecordTooLargeError": "errors",
    "RejectedError": "errors",
    "SpecError": "errors",
    "StaleMessageError": "errors",
    "State": "records",
    "Submission": "records",
    "SubmitStatus": "records",
    "Takeover": "records",
    "ToolSpec": "spec",
    "Transition": "records",
    "TransitionRefusedError": "errors",
    "Unavailable": "spec",
    "ValueTooLargeError": "errors",
    "VolatileLedgerError": "errors",
    "WaitTimeout": "errors",
    "Write": "records",
    "campaign_tag": "campaigns",
    "canonical_bytes": "canonical",
    "derive": "identity",
    "idempotency_key": "identity",
}
__all__ = sorted(_WHERE)


__getattr__ = lazy_exports(__name__, _WHERE)
