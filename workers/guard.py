"""``guarded(tool)``: an effect tool as a plain synchronous function for agent runtimes.

Agent frameworks re-run tools: CrewAI's ``max_retry_limit`` re-runs a whole task after an
executor failure, a LangGraph node runs again after a crash, a model repeats a call it
already made, or makes the same call twice in one turn. A guarded tool submits each call
through effectq (``workers.producer.submit``) and waits for its receipt, so the effect's
key — tool, action, scope, resolved identity fields — decides what happens, not how many
times the tool was called:

    first call                        → executed once by a worker; the receipt
    the same logical call again       → the original receipt; nothing re-fires
    a bound argument changed          → "conflict", not executed
    UNKNOWN (awaiting an operator)    → "outcome unknown, waiting for an operator"; never re-fired
    FAILED, and no message left       → "NOT executed" with the reason (the provider refused
      to run it                          it, or its retries ran out); nothing runs it later
    not DONE within the timeout       → "still pending"; calling again waits on the same key

Every answer is an ``Outcome`` whose text is written for the model (it names the effect key,
a hash). The scope comes from the runtime — ``scope=``, then ``effect_scope(...)`` set by
the application, then the adapter's runtime identity (CrewAI task, LangGraph thread and
node) — never from the model: a call that carries ``scope`` or ``generation`` is refused.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypedDict, get_type_hints

from pydantic import BaseModel, ConfigDict, create_model

from dedupe import Effect, EffectRecord, IdentityError, MissingFieldError, SpecError, State

from .producer import Status, poll_record, submit
from .tool import EffectTool, get_tool

__all__ = [
    "RESERVED_FIELDS",
    "GuardOptions",
    "Guarded",
    "Outcome",
    "OutcomeStatus",
    "current_scope",
    "effect_scope",
    "guarded",
]

# Fields the runtime owns: a model that names them is trying to choose the key or the epoch.
RESERVED_FIELDS = frozenset({"scope", "generation", "action", "idempotency_key", "token"})

ScopeSource = str | Callable[[], str | None]
Resolver = Callable[[Mapping[str, Any]], Mapping[str, Any]]

_scope: ContextVar[str | None] = ContextVar("effectq_scope", default=None)


@contextmanager
def effect_scope(scope: str) -> Iterator[None]:
    """Name the trigger (order id, event id) of every guarded call made inside the block,
    e.g. around ``crew.kickoff()``. Context variables follow threads that copy the context,
    as CrewAI's and LangChain's tool executors do."""
    token = _scope.set(scope)
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> str | None:
    return _scope.get()


class OutcomeStatus(StrEnum):
    DONE = "done"
    PENDING = "pending"
    CONFLICT = "conflict"
    UNKNOWN = "unknown"
    FAILED = "failed"  # known not executed, and no message left that would run it
    INVALID = "invalid"  # the call itself was refused before submission: nothing executed


@dataclass(frozen=True)
class Outcome:
    """What a guarded call established. ``str(outcome)`` is the text the model reads;
    ``replayed`` is True when this call found the effect already submitted or done."""

    status: OutcomeStatus
    message: str
    key: str | None = None
    receipt: dict[str, Any] | None = None
    replayed: bool = False

    def __str__(self) -> str:
        return self.message


def _args_model(tool: EffectTool) -> type[BaseModel]:
    """The model-facing schema: the tool body's declared parameters (after the EffectCall),
    typed from its annotations; undeclared fields are refused, ``scope`` included."""
    hints = get_type_hints(tool.fn)
    params = list(inspect.signature(tool.fn).parameters.values())[1:]
    fields: dict[str, Any] = {
        p.name: (hints.get(p.name, Any), ... if p.default is p.empty else p.default)
        for p in params
        if p.name in tool.spec.fields
    }
    title = "".join(part.title() for part in tool.name.replace("-", "_").split("_"))
    model: type[BaseModel] = create_model(
        f"{title}Args", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model


class Guarded:
    """A guarded tool. Call it with the model's arguments; it returns an ``Outcome``.

    The scope of a call is, in order: ``scope`` (a string, or a zero-argument callable that
    may answer None), ``effect_scope(...)``, the ``runtime_scope`` an adapter passes to
    ``invoke`` (the CrewAI task, the LangGraph thread and node). No scope at all is the
    integrator's error and raises ``MissingFieldError``; it never reaches the model.
    ``resolver`` maps the model's arguments to the ones the effect is keyed on (look the
    customer up, key on the record found) and raises ``LookupError`` for "not found".
    """

    def __init__(
        self,
        tool: EffectTool,
        *,
        scope: ScopeSource | None = None,
        action: str | None = None,
        timeout: float = 30.0,
        resolver: Resolver | None = None,
        description: str | None = None,
    ) -> None:
        if action is not None and action not in tool.spec.actions:
            raise SpecError(f"{tool.name}: action {action!r} is not declared", tool=tool.name)
        self.tool = tool
        self.scope = scope
        self.action = action
        self.timeout = timeout
        self.resolver = resolver
        self.name = tool.name
        self.description = (
            description
            or inspect.getdoc(tool.fn)
            or f"{tool.name}: a side effect, made at most once per request."
        )
        self.args_schema = _args_model(tool)
        # A tool may itself declare a field with one of these names; then it is an argument.
        self._reserved = RESERVED_FIELDS - tool.spec.fields

    def __repr__(self) -> str:
        return f"Guarded({self.name!r})"

    def resolve_scope(self, runtime_scope: str | None = None) -> str:
        if isinstance(self.scope, str):
            return self.scope
        explicit = self.scope() if self.scope is not None else None
        if scope := explicit or current_scope() or runtime_scope:
            return scope
        raise MissingFieldError(
            f"{self.name}: no scope for this call: pass scope=, run it inside "
            "effect_scope(...), or call it from an adapter that knows the run",
            tool=self.name,
        )

    def __call__(self, **args: Any) -> Outcome:
        return self.invoke(args)

    def invoke(self, args: Mapping[str, Any], *, runtime_scope: str | None = None) -> Outcome:
        """One call with the model's ``args``; ``runtime_scope`` is the adapter's run identity."""
        scope = self.resolve_scope(runtime_scope)
        if refused := self._refused(args):
            return refused
        if self.resolver is not None:
            try:
                args = dict(self.resolver(args))
            except LookupError as exc:
                return self._invalid(f"could not resolve the arguments: {exc}")
        try:
            effect = self.tool.derive(scope, args, self.action)
        except IdentityError as exc:
            return self._invalid(exc.message)
        handle = submit(self.tool, scope=scope, action=self.action, **args)
        replayed = handle.status is not Status.ENQUEUED
        if handle.status is Status.CONFLICT:
            return self._conflict(handle.key)
        if handle.status is Status.DONE and handle.receipt is not None:
            return self._done(handle.key, handle.receipt, replayed)
        return self._wait(effect, replayed)

    def _refused(self, args: Mapping[str, Any]) -> Outcome | None:
        if reserved := sorted(self._reserved & set(args)):
            return self._invalid(
                f"{', '.join(reserved)} cannot be set by a tool call: the runtime names "
                f"this request. Call {self.name} again without {', '.join(reserved)}."
            )
        return None

    def _wait(self, effect: Effect, replayed: bool) -> Outcome:
        """Poll the ledger until DONE, UNKNOWN or a terminal FAILED, or until the timeout:
        a wait that ends never resubmits, so a later call finds the same key."""
        ledger = self.tool.runtime.ledger()

        def settled(record: EffectRecord | None) -> Outcome | None:
            if record is None:
                return None
            # Only a settled record is compared: a FAILED one may still carry an earlier
            # call's fingerprint until this call's own claim replaces it.
            if record.state in (State.DONE, State.UNKNOWN):
                if record.fingerprint != effect.fingerprint:
                    return self._conflict(effect.key)
                if record.state is State.UNKNOWN:
                    return self._unknown(effect.key, record.reason, replayed)
                if record.receipt is not None:
                    return self._done(effect.key, record.receipt, replayed)
            # FAILED is terminal once no pending marker is left: the message that would run
            # it again was dead-lettered (rejected outright, or out of retries). While a
            # marker stands, a retry or this call's own message is still to come.
            if (
                record.state is State.FAILED
                and record.fingerprint == effect.fingerprint
                and not ledger.has_pending(effect.key)
            ):
                return self._failed(effect.key, record.reason, replayed)
            return None

        outcome, record = poll_record(ledger, effect.key, self.timeout, settled)
        if outcome is not None:
            return outcome
        return self._pending(effect.key, record.state.value if record else "queued", replayed)

    # -- the texts the model reads ------------------------------------------------------

    def _done(self, key: str, receipt: dict[str, Any], replayed: bool) -> Outcome:
        text = json.dumps(receipt, sort_keys=True)
        if replayed:
            message = (
                f"{self.name} was already done for this request and was NOT executed again "
                f"(effect key {key}). Original receipt: {text}"
            )
        else:
            message = f"{self.name} done (effect key {key}). Receipt: {text}"
        return Outcome(OutcomeStatus.DONE, message, key, receipt, replayed)

    def _conflict(self, key: str) -> Outcome:
        bound = ", ".join(self.tool.spec.bound) or "its arguments"
        message = (
            f"{self.name} NOT executed: conflict. This request (effect key {key}) was already "
            f"made with different values of {bound}; the original stands and this changed "
            "call was refused. Do not retry with other values: ask a human if the change "
            "is intended."
        )
        return Outcome(OutcomeStatus.CONFLICT, message, key, replayed=True)

    def _unknown(self, key: str, reason: str, replayed: bool) -> Outcome:
        message = (
            f"{self.name}: outcome unknown, waiting for an operator (effect key {key}"
            f"{f'; {reason}' if reason else ''}). It will not be sent again by itself; "
            "do not retry it. Report that an operator must resolve this key."
        )
        return Outcome(OutcomeStatus.UNKNOWN, message, key, replayed=replayed)

    def _failed(self, key: str, reason: str, replayed: bool) -> Outcome:
        message = (
            f"{self.name} NOT executed: it failed (effect key {key}"
            f"{f'; {reason}' if reason else ''}). Nothing will run it by itself. Do not "
            "retry the same call unchanged; report the failure, or ask a human."
        )
        return Outcome(OutcomeStatus.FAILED, message, key, replayed=replayed)

    def _pending(self, key: str, state: str, replayed: bool) -> Outcome:
        message = (
            f"{self.name} still pending after {self.timeout:g}s (effect key {key}, state "
            f"{state}). It was submitted once, and calling again does not submit it again: "
            f"call {self.name} again with the same arguments later to get its receipt."
        )
        return Outcome(OutcomeStatus.PENDING, message, key, replayed=replayed)

    def _invalid(self, reason: str) -> Outcome:
        return Outcome(OutcomeStatus.INVALID, f"{self.name} NOT executed: {reason}")


class GuardOptions(TypedDict, total=False):
    """``guarded``'s keyword arguments, for adapters that pass them through."""

    scope: ScopeSource | None
    action: str | None
    timeout: float
    resolver: Resolver | None
    description: str | None


def guarded(
    tool: str | EffectTool,
    *,
    scope: ScopeSource | None = None,
    action: str | None = None,
    timeout: float = 30.0,
    resolver: Resolver | None = None,
    description: str | None = None,
) -> Guarded:
    """Guard a declared effect tool (an ``EffectTool`` or its name) for an agent runtime."""
    target = get_tool(tool) if isinstance(tool, str) else tool
    return Guarded(
        target,
        scope=scope,
        action=action,
        timeout=timeout,
        resolver=resolver,
        description=description,
    )
