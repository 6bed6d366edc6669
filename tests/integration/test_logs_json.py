"""With ``EFFECTQ_LOG_FORMAT=json`` every line a real process writes is one JSON object,
without ANSI escapes (workers.logs):

* ``effectq worker`` (its supervisor, each slot's Dramatiq main process, the worker
  process): boot and shutdown lines of Dramatiq's main process, Dramatiq's line about a
  message it received (the message by id, never its arguments), and the lines Dramatiq's
  retry middleware writes about a message after it ran (retrying, retries exceeded) and
  the dead letter, each with the message's tool, key prefix and id;
* ``effectq api`` under uvicorn: its server lines (uvicorn.error, a malformed request's
  warning included) without uvicorn's coloured copy, and the access lines, the key's
  prefix on a route that names one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any

import httpx

from tests.api.conftest import TOKENS
from tests.support.stack import wait_for
from workers import submit
from workers.dev.local import LocalStack
from workers.dev.ports import free_port

ARGS = {"customer": "cus-json-9", "amount": "3.00", "currency": "eur"}
ESC = "\x1b"


def json_lines(text: str, what: str) -> list[dict[str, Any]]:
    """Every non-empty line of ``text`` as a JSON object; the first that is not fails."""
    for escape in (ESC, "\\u001b"):  # raw, or escaped inside a JSON string
        assert escape not in text, f"{what}: an ANSI escape: {text[:2000]}"
    parsed = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise AssertionError(f"{what}: not a JSON line: {line[:300]}") from None
        assert isinstance(value, dict), line[:300]
        assert "color_message" not in value, line[:300]
        parsed.append(value)
    return parsed


def test_every_line_of_a_worker_pool_is_json_retries_and_main_process_included(
    live: LocalStack,
) -> None:
    live.sandbox.configure(fail_rate=1.0)  # the provider refuses before executing: retries
    pool = live.start_workers(
        processes=1, threads=2, EFFECTQ_LOG_FORMAT="json", EFFECTQ_MAX_RETRIES="2",
        EFFECTQ_LOG_LEVEL="debug",  # Dramatiq's "Received message <the message>" too
    )  # fmt: skip
    handle = submit("charge", scope="order-json-1", **ARGS)

    def dead_lettered() -> bool:
        return "dead-lettered" in live.log("workers.log")

    wait_for(dead_lettered, timeout=60, what="the retries, then the dead letter")
    assert live.stop_pool(pool) == 0
    text = live.log("workers.log")
    lines = json_lines(text, "workers.log")
    loggers = {line["logger"] for line in lines}
    # The supervisor, Dramatiq's main process, its worker process.
    assert {"effectq.worker", "dramatiq.MainProcess", "dramatiq.WorkerProcess(0)"} <= loggers
    about = [
        line for line in lines
        if line["logger"].startswith(("dramatiq.middleware.retries", "workers.broker"))
    ]  # fmt: skip
    received = [
        line for line in lines
        if line["logger"] == "dramatiq.worker.WorkerThread"
        and line["message"].startswith("Received message")
    ]  # fmt: skip
    assert received, "no line of Dramatiq's about a received message"
    # Named by its id: the message's str() would print its envelope, arguments and all.
    assert received[0]["message"].startswith(f"Received message charge[{handle.message_id}]")
    about += received
    messages = [line["message"] for line in about]
    assert any(m.startswith("Retrying message") for m in messages), messages
    assert any(m.startswith("Retries exceeded") for m in messages), messages
    assert any(m.startswith("dead-lettered") for m in messages), messages
    for line in about:
        assert line["tool"] == "charge", line
        assert line["key"] == handle.key[:12] and line["message_id"] == handle.message_id, line
    assert handle.key not in text and ARGS["customer"] not in text


def test_every_line_of_the_api_under_uvicorn_is_json_access_and_errors_included(
    stack: LocalStack,
) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "workers", "api", "--port", str(port)],
        env=stack.env(EFFECTQ_API_TOKENS=TOKENS, EFFECTQ_LOG_FORMAT="json"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    key = "ab" * 32
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return server.poll() is not None

        wait_for(up, timeout=30, what="effectq api serving")
        assert httpx.get(f"{url}/v1/effects/{key}").status_code == 401
        # Not HTTP at all: uvicorn's own warning line.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(b"\x16\x03\x01 not http\r\n\r\n")
            raw.recv(1024)
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    lines = json_lines(out, "stdout") + json_lines(err, "stderr")
    by_logger: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        by_logger.setdefault(line["logger"], []).append(line)
    server_lines = [line["message"] for line in by_logger["uvicorn.error"]]
    assert any(m.startswith("Uvicorn running on") for m in server_lines), server_lines
    assert any("Invalid HTTP request" in m for m in server_lines), server_lines
    access = {line["message"].rsplit(" ", 1)[0]: line for line in by_logger["workers.api.access"]}
    assert "key" not in access["GET /healthz 200"]
    assert access["GET /v1/effects/{key} 401"]["key"] == key[:12]
    assert key not in out + err
