"""The module each Dramatiq worker process of ``effectq worker`` imports
(``dramatiq workers.entry``): this process's runtime, built from the environment and
installed as Dramatiq's broker, with the tools of ``EFFECTQ_TOOLS`` bound to it. Importing
it has these effects on purpose: that is Dramatiq's CLI contract."""

from __future__ import annotations

from . import registry
from .runtime import Runtime, install

runtime = install(Runtime.from_settings())
registry.load(runtime.settings.tools)
