"""Dramatiq integration: tool declaration, producer API, middleware, CLI, sandbox provider."""
