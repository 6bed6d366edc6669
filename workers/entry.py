"""The module each Dramatiq worker process of ``effectq worker`` imports
(``dramatiq workers.entry``): this process's runtime, built from the environment and
installed as Dramatiq's broker, its logging and tracing set up, the liveness heartbeat its
supervisor asked for added (``workers.lifeline.Heartbeat``), and the tools of
``EFFECTQ_TOOLS`` bound to it; first of all, the process set to die with the Dramatiq main
process that forked it (``workers.lifeline``). Importing it has these effects on purpose:
that is Dramatiq's CLI contract."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys

from . import lifeline, logs, registry, tracing
from .broker.redis import EffectqRedisBroker
from .runtime import Runtime, install
from .settings import Settings

# Dramatiq imports this module in each worker process it forks, before it consumes. A main
# process SIGKILLed from here on sends its worker processes SIGTERM (they drain); one already
# dead leaves this one nothing to serve. Imported elsewhere (no parent process), nothing to do.
_parent = multiprocessing.parent_process()
if _parent is not None and _parent.pid is not None and not lifeline.die_with_parent(_parent.pid):
    sys.stderr.write("effectq: the Dramatiq main process died before this worker booted\n")
    sys.stderr.flush()
    # Not sys.exit: Dramatiq's boot would then set its boot event, whose notify waits forever
    # for the dead main process that was waiting on it (a stray that never leaves).
    os._exit(0)

_settings = Settings()
logs.setup(_settings)
tracing.configure(_settings)
runtime = install(Runtime.from_settings(_settings))
_beat = lifeline.heartbeat_from_environment(_settings.health_stall_s)
if _beat is not None:
    runtime.broker.add_middleware(_beat)
registry.load(runtime.settings.tools)
# A broker that can forget an accepted message loses effects silently but for the pending
# check at submit (producer: the broker is asked before "pending" is answered); say so.
_broker = runtime.broker
if isinstance(_broker, EffectqRedisBroker) and (_problem := _broker.durability_problem()):
    logging.getLogger("effectq.broker").warning(
        "the broker Redis %s: a restart or failover forgets accepted messages; a resubmission "
        "sends them again, nothing else does. Enable appendonly on the broker Redis.",
        _problem,
    )
