"""``python -m workers.dev.sandbox``: serve the sandbox provider until interrupted."""

from .process import main

main()
