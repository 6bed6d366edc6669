"""effectq's HTTP API and operator console: ``effectq api`` (docs/api.md), extra ``[api]``.

``workers.api.app.create_app`` builds the ASGI app; its routes and pages act only through
``workers.verbs``, the door the CLI uses too.
"""
