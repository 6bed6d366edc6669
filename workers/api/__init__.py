"""effectq's HTTP API and operator console: ``effectq api`` (docs/api.md).

``workers.api.app.create_app`` builds the ASGI app. ``workers.api.verbs`` is what the CLI and
the API both run; it imports no web framework, so importing this package stays cheap for
the CLI.
"""
