"""The committed OpenAPI document (docs/openapi.json) is the one `effectq api` serves, and
`effectq api` refuses to start without tokens."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx

from tests.api.conftest import TOKENS
from tests.support.stack import wait_for
from workers.dev.local import LocalStack
from workers.dev.ports import free_port

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
REGENERATE = "regenerate it: effectq api --openapi > docs/openapi.json"


def unversioned(document: dict[str, Any]) -> dict[str, Any]:
    """The document less info.version: the package's, which changes with every commit
    (setuptools-scm), while the committed document changes with the API."""
    info = {k: v for k, v in document["info"].items() if k != "version"}
    return {**document, "info": info}


def test_the_served_document_is_the_committed_one(stack: LocalStack) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "workers", "api", "--port", str(port)],
        env=stack.env(EFFECTQ_API_TOKENS=TOKENS), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/openapi.json", timeout=1).status_code == 200
            except httpx.TransportError:
                return server.poll() is not None  # stop waiting: it exited

        wait_for(up, timeout=30, what="effectq api serving")
        assert server.poll() is None, server.stdout.read() if server.stdout else ""
        served = httpx.get(f"{url}/openapi.json").json()
        assert unversioned(served) == unversioned(json.loads(COMMITTED.read_text())), REGENERATE
        assert served["info"]["version"] == version("effectq")
        assert httpx.get(f"{url}/v1/effects/{'0' * 64}").status_code == 401
        assert httpx.get(f"{url}/docs").status_code == 404  # no CDN-loaded docs page
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)
    # uvicorn shuts down cleanly on SIGTERM, then re-raises it as its exit status.
    assert server.returncode == -signal.SIGTERM, output
    assert "Application shutdown complete" in output
    assert "s3cret" not in output and "token-0123456789abcdef" not in output


def test_the_printed_document_is_the_committed_one() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "workers", "api", "--openapi"], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    printed_document = json.loads(printed.stdout)
    assert unversioned(printed_document) == unversioned(json.loads(COMMITTED.read_text())), (
        REGENERATE
    )


def test_effectq_api_refuses_to_start_without_tokens(stack: LocalStack) -> None:
    for tokens, reason in (("", "EFFECTQ_API_TOKENS is empty"),
                           ("ana:tiny:read", "entry 1 (ana): the token must be")):  # fmt: skip
        refused = subprocess.run(
            [sys.executable, "-m", "workers", "api", "--port", str(free_port())],
            env=stack.env(EFFECTQ_API_TOKENS=tokens), capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert refused.returncode == 2 and reason in refused.stderr, refused.stderr
        assert "tiny" not in refused.stderr
