"""The module each Dramatiq worker process of ``effectq worker`` imports
(``dramatiq workers.entry``): this process's runtime, built from the environment and
installed as Dramatiq's broker, its logging and tracing set up, the liveness heartbeat its
supervisor asked for added (``workers.heartbeat``), and the tools of ``EFFECTQ_TOOLS`` bound
to it. Importing it has these effects on purpose: that is Dramatiq's CLI contract."""

from __future__ import annotations

from . import heartbeat, logs, registry, tracing
from .runtime import Runtime, install
from .settings import Settings

_settings = Settings()
logs.setup(_settings)
tracing.configure(_settings)
runtime = install(Runtime.from_settings(_settings))
_beat = heartbeat.from_environment(_settings.health_stall_s)
if _beat is not None:
    runtime.broker.add_middleware(_beat)
registry.load(runtime.settings.tools)
