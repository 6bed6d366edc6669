"""Configuration from the environment (prefix ``EFFECTQ_``), one typed object, built where a
process starts (``Settings()``) and handed on: nothing reads it again behind the caller."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from dedupe import Ledger, ToolSpec

__all__ = ["Settings", "check_lost_writes", "ledger_from_settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EFFECTQ_", extra="ignore")

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        description="the ledger's Redis (a Redis Cluster: its nodes' URLs, comma-separated)",
    )
    broker_url: str = Field(default="redis://127.0.0.1:6379/1", description="redis://… or amqp://…")
    namespace: str = "effectq"
    tools: str = Field(default="workers.examples", description="module declaring the tools")
    allow_volatile_ledger: bool = False
    # A ledger that can lose an acknowledged write on a host crash (appendfsync everysec or
    # no, without wait_replicas) is refused for a tool whose provider does not deduplicate
    # by key (ToolSpec.provider_idempotency) unless this is set: the operator's explicit
    # acceptance of that window (README, "What each setting can lose").
    allow_lost_writes: bool = False
    # WAIT for this many replicas after each ledger write (a claim, commit, fail, takeover
    # or operator write they did not acknowledge is "ledger unavailable": retried), bounded
    # by wait_timeout_ms.
    wait_replicas: int = 0
    wait_timeout_ms: int = 500
    # A namespace the ledger database does not know yet is refused where the database
    # already holds keys (a changed namespace would let every recorded effect run again):
    # true for a second deployment on one ledger, on purpose.
    allow_new_namespace: bool = False
    failpoints: str = ""
    # Metrics (docs/metrics.md): the exposition port of a worker pool's supervisor or of a
    # reconciler (0: none), its address, the pool's prometheus-client multiprocess directory
    # (empty: a fresh temporary one), and a switch for the worker path's counters.
    metrics_port: int = 9191
    metrics_host: str = "0.0.0.0"
    metrics_dir: str = ""
    metrics_enabled: bool = True
    # Health (docs/observability.md). A worker pool's /healthz fails when a child is dead and
    # not restarted, when a child sent no heartbeat for `health_stall_s` (its consumer
    # stopped, or every worker thread has been inside one message that long: keep it above
    # the longest tool call), or after more than `health_max_restarts` restarts within
    # `health_restart_window_s`. A reconciler's fails when its loop did not turn (no pass
    # finished or failed) within `reconciler_stall_intervals` times its --interval, and
    # never sooner than `health_stall_s` (a pass takes as long as its lookups).
    health_stall_s: float = Field(default=60.0, gt=0)
    health_max_restarts: int = Field(default=5, ge=0)
    health_restart_window_s: float = Field(default=300.0, gt=0)
    reconciler_stall_intervals: int = Field(default=5, ge=1)
    # Logs of every effectq process: one line per record, as JSON objects or as text.
    log_format: Literal["json", "text"] = "text"
    log_level: Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"] = "INFO"
    # OpenTelemetry traces over OTLP/HTTP (extra [otel]) to this base URL (the exporter
    # posts to <endpoint>/v1/traces); empty: off, and the worker path pays nothing.
    otel_endpoint: str = ""
    otel_service_name: str = "effectq"
    queue: str = "effectq"
    # Dramatiq's Redis broker requeues a dead worker's messages only after this heartbeat
    # timeout, and only during a maintenance pass (chance per million commands). On
    # RabbitMQ it is the AMQP heartbeat (whole seconds) unless the URL sets `heartbeat=`:
    # RabbitMQ requeues a frozen worker's messages once it missed heartbeats that long.
    # Each worker process also runs that maintenance every `broker_maintenance_interval_ms`
    # (0: never), so on the Redis broker a dead worker's messages are back on their queue
    # within heartbeat timeout + interval (65 s on these defaults) on any traffic.
    broker_heartbeat_timeout_ms: int = 60_000
    broker_maintenance_chance: int = 1_000
    broker_maintenance_interval_ms: int = 5_000
    retry_min_backoff_ms: int = 1_000
    retry_max_backoff_ms: int = 300_000
    max_retries: int = 20
    pending_ttl_s: float = 3600.0
    # A pending marker first reserves the call for this long; once the broker accepted the
    # message it lasts pending_ttl_s. A producer killed in between leaves nothing pending
    # for longer than this.
    pending_reservation_s: float = 10.0
    # On a broker that cannot be asked whether it still holds a message (RabbitMQ), a
    # confirmed marker answers "pending" for at most this long; a worker retrying the
    # message renews it. A lost message is then sent again by the next submission after
    # this long (a second message for one effect is harmless: the claim decides).
    unverifiable_pending_ttl_s: float = 120.0
    # The reconciler: lookups that fail are retried with backoff (base * 2^round seconds,
    # at most 60) for this many rounds, then the effect is UNKNOWN.
    reconciler_budget: int = 5
    reconciler_backoff_s: float = 1.0
    reconciler_lease_s: float = 30.0
    # The HTTP API and operator console (`effectq api`, docs/api.md). Bearer tokens as
    # "NAME:TOKEN:SCOPE[,SCOPE];…" with scopes submit, read, operate (a secret: never
    # printed). Bodies are bounded (413 over the bound); a campaign's list may be larger.
    # The console's login cookie lasts `api_session_s` and is `Secure` unless told otherwise
    # (plain HTTP off localhost).
    api_tokens: SecretStr = SecretStr("")
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    api_max_body_bytes: int = 64 * 1024
    api_max_campaign_bytes: int = 16 * 1024 * 1024
    api_session_s: float = 8 * 3600.0
    api_cookie_secure: bool = True

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value  # info == INFO

    @field_validator("log_format", mode="before")
    @classmethod
    def _format_lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value


def ledger_from_settings(cfg: Settings) -> Ledger:
    """A new ledger on ``cfg.redis_url``, refused without AOF unless allowed, and refused
    when the ledger is laid out under another namespace or bucket count."""
    from dedupe import Ledger

    ledger = Ledger.from_url(
        cfg.redis_url,
        namespace=cfg.namespace,
        allow_volatile=cfg.allow_volatile_ledger,
        wait_replicas=cfg.wait_replicas,
        wait_timeout_ms=cfg.wait_timeout_ms,
    )
    ledger.check_layout(allow_new_namespace=cfg.allow_new_namespace)
    return ledger


def check_lost_writes(cfg: Settings, ledger: Ledger, specs: Iterable[ToolSpec]) -> None:
    """Refuse (LedgerConfigError, one line naming the setting) to run a tool whose provider
    does not deduplicate by key on a ledger that can lose an acknowledged write: with
    appendfsync everysec or no, a host crash forgets up to about a second of claims,
    commits and floor raises, and the next claim runs the effect again with nothing at the
    provider to stop it. WAIT for replicas narrows that window; the operator may accept it
    (EFFECTQ_ALLOW_LOST_WRITES). A server that will not say (CONFIG refused) is not
    refused here: the durability check already demanded AOF."""
    from dedupe import LedgerConfigError

    if cfg.allow_lost_writes or cfg.wait_replicas > 0 or cfg.allow_volatile_ledger:
        return
    exposed = sorted(s.name for s in specs if not s.provider_idempotency)
    if not exposed:
        return
    policy = ledger.fsync_policy()
    if policy in (None, "always"):
        return
    raise LedgerConfigError(
        f"the ledger Redis runs appendfsync {policy}: a host crash can forget acknowledged "
        f"claims, and tool(s) {', '.join(exposed[:5])} declare no provider idempotency to "
        "stop a second execution; set appendfsync always, EFFECTQ_WAIT_REPLICAS, or "
        "EFFECTQ_ALLOW_LOST_WRITES=true"
    )
