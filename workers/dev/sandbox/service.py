"""The sandbox provider's service: a real HTTP service that executes "effects" and counts
them (``workers.dev.sandbox.process`` runs it as a child process).

It stands in for an e-mail or payment API in the demo, the tests and the benchmarks
(DESIGN.md §5). ``GET /v1/stats`` is the ground truth the invariants are checked against:
how many times each idempotency key was really executed.

Endpoints::

    POST /v1/effects            Idempotency-Key (required), Fencing-Token (optional int)
                                201 new receipt | 200 stored receipt (provider idempotency)
                                400 bad header/body | 409 stale token | 413 body > 64 KiB
                                503 injected failure (nothing executed)
    GET  /v1/effects/{key}      200 latest visible receipt | 404 | 409 stale token
                                501 lookup disabled
    GET  /v1/stats              {"executions": {key: count}, "total": n}
    GET  /v1/executions         ?after=SEQ&limit=N: the execution log, oldest first, paged
                                {"executions": [...], "next_after": SEQ | null, "total": n}
    POST /v1/admin/fail-next    {"key": K, "count": N}: the next N POSTs under the
                                idempotency key K answer 503 (nothing executed)
    GET|POST /v1/admin/config   read / change the fault switches (any subset of fields)
    POST /v1/admin/reset        forget all effects, counts and tokens

Fault switches (``SandboxConfig``): ``fail_rate`` answers 503 before executing;
``drop_ack_rate`` executes and records the effect, then hangs up without a response.
Under uvicorn the socket is closed before a single byte of the answer is written, so an
httpx client sees ``httpx.RemoteProtocolError("Server disconnected without sending a
response.")`` -- a transport error, never a status code. Under another ASGI server the
app raises instead (that server answers 500 or closes). ``latency_ms`` delays every
``/v1/effects`` request, ``lookup_latency_ms`` delays lookups (GET) only, on top of it
(a slow lookup index beside a fast send path), ``lookup_lag_s`` hides new effects from
lookups for that long, ``lookup_enabled=False`` answers 501 to lookups,
``provider_idempotency=False`` executes every POST again, and ``seed`` makes the fault
schedule replayable (reset re-seeds).

The execution log is the ground truth with values: one entry per real execution, in order
(``seq`` from 1), carrying the idempotency key, the ``Effect-Key`` header when the caller
sent one, the fencing token, the request body, the receipt id and the provider's time. A
system-level checker reads it to tell which generation ran with which values.

With a state file every execution is appended as one JSON line (the receipt) and fsynced
before it is acknowledged, and reloaded at start, so a SIGKILLed sandbox keeps its ground
truth; so is every raise of a key's highest fencing token seen only through a lookup (a
``{"fence": key, "token": n}`` line), so a restart does not let a paused holder's older
token through.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypedDict

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

__all__ = [
    "MAX_BODY_BYTES",
    "Execution",
    "Receipt",
    "SandboxConfig",
    "create_app",
    "serve",
]

MAX_BODY_BYTES = 64 * 1024
_KEY_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
_TOKEN_RE = re.compile(r"-?[0-9]{1,18}")
# Internal marker from the POST handler to the outermost layer; never reaches the client.
_DROP_HEADER = b"x-sandbox-drop-ack"


@dataclass(frozen=True)
class SandboxConfig:
    """Fault switches; every field can be changed at runtime via ``/v1/admin/config``."""

    fail_rate: float = 0.0
    drop_ack_rate: float = 0.0
    latency_ms: float = 0.0
    lookup_latency_ms: float = 0.0
    lookup_lag_s: float = 0.0
    lookup_enabled: bool = True
    provider_idempotency: bool = True
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("fail_rate", "drop_ack_rate", "latency_ms", "lookup_latency_ms",
                     "lookup_lag_s"):  # fmt: skip
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number")
        for name in ("fail_rate", "drop_ack_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1")
        for name in ("latency_ms", "lookup_latency_ms", "lookup_lag_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")

    def updated(self, changes: Mapping[str, object]) -> SandboxConfig:
        """A copy with ``changes`` applied; ``ValueError`` names the first bad field."""
        names = {f.name for f in fields(self)}
        clean: dict[str, Any] = {}
        for name, value in changes.items():
            if name not in names:
                raise ValueError(f"unknown config field {name!r}")
            # bool is an int subclass, so it is ruled in or out explicitly.
            if name == "seed":
                ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
            elif isinstance(getattr(self, name), bool):
                ok = isinstance(value, bool)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                value, ok = float(value), True
            else:
                ok = False
            if not ok:
                raise ValueError(f"bad value for {name}: {value!r}")
            clean[name] = value
        return replace(self, **clean)


class Receipt(TypedDict):
    id: str
    key: str
    token: int | None
    body: dict[str, Any]
    created_at: float


class Execution(TypedDict):
    """One entry of the execution log (``GET /v1/executions``)."""

    seq: int
    id: str
    idempotency_key: str
    effect_key: str | None
    token: int | None
    body: dict[str, Any]
    created_at: float


class _Reject(Exception):
    """Ends a request with a JSON error; raised from anywhere in a handler."""

    def __init__(self, status: int, error: str, **extra: object) -> None:
        super().__init__(error)
        self.status = status
        self.payload: dict[str, object] = {"error": error, **extra}


class _Sandbox:
    """The provider's state and handlers; one instance per app, one event loop."""

    def __init__(self, config: SandboxConfig, state_file: Path | None) -> None:
        self.config = config
        self.state_file = state_file
        self.rng = random.Random(config.seed)
        self.lock = asyncio.Lock()
        self.receipts: dict[str, list[Receipt]] = {}
        self.executions: dict[str, int] = {}
        self.highest: dict[str, int] = {}
        self.log: list[Execution] = []
        # Injected 503s per idempotency key (``/v1/admin/fail-next``): not persisted, as the
        # other fault switches are not.
        self.fail_next: dict[str, int] = {}
        if state_file is not None and state_file.exists():
            self._reload(state_file)

    def _reload(self, path: Path) -> None:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by SIGKILL mid-write was never acknowledged
            if "fence" in entry:
                key, token = entry["fence"], entry["token"]
                self.highest[key] = max(self.highest.get(key, token), token)
            else:
                effect_key = entry.pop("effect_key", None)
                self._record(entry, effect_key)

    def _record(self, receipt: Receipt, effect_key: str | None) -> None:
        key = receipt["key"]
        self.log.append(
            {
                "seq": len(self.log) + 1,
                "id": receipt["id"],
                "idempotency_key": key,
                "effect_key": effect_key,
                "token": receipt["token"],
                "body": receipt["body"],
                "created_at": receipt["created_at"],
            }
        )
        self.receipts.setdefault(key, []).append(receipt)
        self.executions[key] = self.executions.get(key, 0) + 1
        if receipt["token"] is not None:
            self.highest[key] = max(self.highest.get(key, receipt["token"]), receipt["token"])

    def _persist(self, entry: Mapping[str, object]) -> None:
        assert self.state_file is not None
        with self.state_file.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _roll(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    def _fence(self, key: str, token: int | None) -> bool:
        """Reject a token below the highest seen for ``key``; otherwise remember it.
        True when it raised the highest."""
        if token is None:
            return False
        highest = self.highest.get(key)
        if highest is not None and token < highest:
            raise _Reject(409, "stale fencing token", highest=highest)
        self.highest[key] = token
        return highest != token

    async def _delay(self) -> None:
        if self.config.latency_ms > 0:
            await asyncio.sleep(self.config.latency_ms / 1000)

    async def post_effect(self, request: Request) -> JSONResponse:
        await self._delay()
        key = _idempotency_key(request.headers.get("idempotency-key"))
        token = _fencing_token(request.headers.get("fencing-token"))
        effect_key = request.headers.get("effect-key")
        if effect_key is not None:
            effect_key = _idempotency_key(effect_key)
        body = await _json_object(request)
        if self._roll(self.config.fail_rate):
            raise _Reject(503, "injected failure")
        async with self.lock:
            if self.fail_next.get(key, 0) > 0:
                self.fail_next[key] -= 1
                raise _Reject(503, "injected failure")
            raised = self._fence(key, token)
            stored = self.receipts.get(key)
            if stored and self.config.provider_idempotency:
                if raised and self.state_file is not None:
                    await asyncio.to_thread(self._persist, {"fence": key, "token": token})
                return JSONResponse(stored[-1], status_code=200)
            receipt: Receipt = {
                "id": f"eff_{uuid.uuid4().hex[:12]}",
                "key": key,
                "token": token,
                "body": body,
                "created_at": time.time(),
            }
            if self.state_file is not None:
                # Off the event loop: fsync must not stall concurrent lookups. The effect key
                # rides on the line only (a receipt is what the caller sent back).
                line = {**receipt, "effect_key": effect_key} if effect_key else receipt
                await asyncio.to_thread(self._persist, line)
            self._record(receipt, effect_key)
            drop = self._roll(self.config.drop_ack_rate)
        headers = {_DROP_HEADER.decode(): "1"} if drop else None
        return JSONResponse(receipt, status_code=201, headers=headers)

    async def get_effect(self, request: Request) -> JSONResponse:
        await self._delay()
        if self.config.lookup_latency_ms > 0:
            await asyncio.sleep(self.config.lookup_latency_ms / 1000)
        if not self.config.lookup_enabled:
            raise _Reject(501, "lookup disabled")
        key = _idempotency_key(request.path_params["key"])
        token = _fencing_token(request.headers.get("fencing-token"))
        async with self.lock:
            if self._fence(key, token) and self.state_file is not None:
                await asyncio.to_thread(self._persist, {"fence": key, "token": token})
            horizon = time.time() - self.config.lookup_lag_s
            visible = [r for r in self.receipts.get(key, []) if r["created_at"] <= horizon]
        if not visible:
            raise _Reject(404, "not found")
        return JSONResponse(visible[-1])

    async def stats(self, request: Request) -> JSONResponse:
        async with self.lock:
            counts = dict(self.executions)
        return JSONResponse({"executions": counts, "total": sum(counts.values())})

    async def execution_log(self, request: Request) -> JSONResponse:
        after = _bounded_int(request.query_params.get("after", "0"), "after", 0, 10**12)
        limit = _bounded_int(request.query_params.get("limit", "1000"), "limit", 1, 10_000)
        async with self.lock:
            page = self.log[after : after + limit]  # seq n sits at index n - 1
            total = len(self.log)
        following = page[-1]["seq"] if page and page[-1]["seq"] < total else None
        return JSONResponse({"executions": page, "next_after": following, "total": total})

    async def set_fail_next(self, request: Request) -> JSONResponse:
        payload = await _json_object(request)
        key = payload.get("key")
        count = payload.get("count", 1)
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise _Reject(400, "key must be an idempotency key")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 10**6:
            raise _Reject(400, "count must be an integer between 0 and 1000000")
        async with self.lock:
            self.fail_next[key] = count
        return JSONResponse({"key": key, "count": count})

    async def get_config(self, request: Request) -> JSONResponse:
        return JSONResponse(asdict(self.config))

    async def set_config(self, request: Request) -> JSONResponse:
        changes = await _json_object(request)
        try:
            config = self.config.updated(changes)
        except ValueError as exc:
            raise _Reject(400, str(exc)) from None
        async with self.lock:
            if "seed" in changes:
                self.rng.seed(config.seed)
            self.config = config
        return JSONResponse(asdict(config))

    async def reset(self, request: Request) -> JSONResponse:
        async with self.lock:
            self.receipts.clear()
            self.executions.clear()
            self.highest.clear()
            self.log.clear()
            self.fail_next.clear()
            self.rng.seed(self.config.seed)
            if self.state_file is not None:
                self.state_file.write_bytes(b"")
        return JSONResponse({"reset": True})


def _idempotency_key(raw: str | None) -> str:
    if raw is None or not _KEY_RE.fullmatch(raw):
        raise _Reject(400, "Idempotency-Key must be 1..200 characters of [A-Za-z0-9._:-]")
    return raw


def _bounded_int(raw: str, name: str, low: int, high: int) -> int:
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise _Reject(400, f"{name} must be an integer between {low} and {high}")
    return int(raw)


def _fencing_token(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _TOKEN_RE.fullmatch(raw.strip()):
        raise _Reject(400, "Fencing-Token must be an integer")
    return int(raw)


class _NotFinite(Exception):
    pass


def _not_finite(_constant: str) -> float:
    raise _NotFinite


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite
    return value


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, read with a size bound."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _Reject(413, "body too large", limit=MAX_BODY_BYTES)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise _Reject(413, "body too large", limit=MAX_BODY_BYTES)
    try:
        body = json.loads(raw, parse_constant=_not_finite, parse_float=_finite)
    except _NotFinite:
        # Python's json reads NaN / Infinity (and 1e999 as infinity); JSON has neither, and
        # a receipt holding one could never be served again.
        raise _Reject(400, "body must be JSON without NaN or Infinity") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _Reject(400, "body must be a JSON object") from None
    if not isinstance(body, dict):
        raise _Reject(400, "body must be a JSON object")
    return body


async def _on_reject(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, _Reject)
    return JSONResponse(exc.payload, status_code=exc.status)


class _SandboxApp(Starlette):
    """Starlette with one extra outermost layer that can hang up instead of answering.

    It must sit outside Starlette's own middleware: only the server's ``send`` leads
    to the connection, and Starlette wraps ``send`` in closures.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        dropped = False

        async def send_or_drop(message: Message) -> None:
            nonlocal dropped
            if message["type"] == "http.response.start":
                dropped = any(name == _DROP_HEADER for name, _ in message.get("headers", []))
            if not dropped:
                await send(message)

        await super().__call__(scope, receive, send_or_drop)
        if dropped:
            await _hang_up(send)


async def _hang_up(send: Send) -> None:
    """Close the connection without writing a response (the effect is already committed)."""
    # uvicorn's send is a bound method of its request cycle, which holds the transport.
    # (Duck-typed: uvloop's transports are not asyncio.Transport subclasses.)
    transport: Any = getattr(getattr(send, "__self__", None), "transport", None)
    if not callable(getattr(transport, "abort", None)):
        raise RuntimeError("ack dropped by the sandbox")
    transport.abort()
    # Let connection_lost run now, so uvicorn marks the cycle disconnected and does not
    # answer "500: returned without starting response" on our behalf.
    await asyncio.sleep(0)


def create_app(config: SandboxConfig, state_file: Path | None = None) -> Starlette:
    sandbox = _Sandbox(config, state_file)
    routes = [
        Route("/v1/effects", sandbox.post_effect, methods=["POST"]),
        Route("/v1/effects/{key}", sandbox.get_effect, methods=["GET"]),
        Route("/v1/stats", sandbox.stats, methods=["GET"]),
        Route("/v1/executions", sandbox.execution_log, methods=["GET"]),
        Route("/v1/admin/fail-next", sandbox.set_fail_next, methods=["POST"]),
        Route("/v1/admin/config", sandbox.get_config, methods=["GET"]),
        Route("/v1/admin/config", sandbox.set_config, methods=["POST"]),
        Route("/v1/admin/reset", sandbox.reset, methods=["POST"]),
    ]
    return _SandboxApp(routes=routes, exception_handlers={_Reject: _on_reject})


def serve(
    config: SandboxConfig,
    host: str = "127.0.0.1",
    port: int = 8765,
    state_file: Path | None = None,
) -> None:
    """Run the sandbox until interrupted (blocking)."""
    app = create_app(config, state_file)
    # The same loop and HTTP parser whatever else is installed (uvloop and httptools come
    # with some extras): the fault switches are tested against these two.
    uvicorn.run(
        app, host=host, port=port, log_level="warning", access_log=False, loop="asyncio", http="h11"
    )
