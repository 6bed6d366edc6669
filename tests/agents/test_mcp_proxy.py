"""``effectq mcp --upstream``: a real upstream MCP server started by the test, fronted by the
proxy; its side-effecting tool runs in an effectq worker, its read-only tool passes through."""

from __future__ import annotations

from tests.agents.extras import require

require("mcp", "mcp")

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

from tests.agents.test_mcp import run_client  # noqa: E402
from tests.support.stack import wait_for  # noqa: E402
from workers.dev.local import LocalStack  # noqa: E402
from workers.dev.ports import free_port  # noqa: E402

UPSTREAM = Path(__file__).with_name("upstream_server.py")
TICKET = {"project": "OPS", "title": "Rotate the keys", "body": "Before Friday."}


@pytest.fixture
def upstream(live: LocalStack) -> Iterator[tuple[str, Path]]:
    port, log = free_port(), live.workdir / "tickets.log"
    log.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(UPSTREAM), str(port), str(log)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"

    def up() -> bool:
        assert proc.poll() is None, "the upstream server exited"
        try:
            httpx.get(url, timeout=1)
            return True
        except httpx.TransportError:
            return False

    wait_for(up, timeout=30, what="the upstream MCP server")
    yield url, log
    proc.kill()
    proc.wait()


def test_a_side_effecting_upstream_tool_retried_runs_once_and_reads_pass_through(
    live: LocalStack, upstream: tuple[str, Path]
) -> None:
    url, log = upstream
    config = live.workdir / "upstream.json"
    guarded = {
        "identity": ["project", "title"], "bound": ["project", "title"], "free": ["body"],
        "key_argument": "request_id",
    }  # fmt: skip
    config.write_text(json.dumps({"upstream": {"url": url}, "tools": {"create_ticket": guarded}}))
    live.start_workers(
        1, 2, EFFECTQ_TOOLS="workers.agents.upstream", EFFECTQ_MCP_UPSTREAM=str(config)
    )
    proxy = {"argv": ["-m", "workers", "mcp", "--upstream", str(config)], "env": live.env()}
    call = {"tool": "create_ticket", "args": TICKET, "key": "req-77", "until": "done"}
    answers = run_client(
        {
            "stdio": proxy,
            "list": True,
            # The second is a retry: a new proxy process, a new session, the same request.
            "calls": [call, call, {"tool": "count_tickets", "args": {"project": "OPS"}}],
        }
    )
    print("client transcript:", *answers, sep="\n  ")
    listed = {t["name"]: t for t in answers[0]["tools"]}
    assert set(listed["create_ticket"]["inputSchema"]["properties"]) == {"project", "title", "body"}
    assert "outputSchema" not in listed["create_ticket"]  # the answer is effectq's
    assert listed["count_tickets"]["description"] == "How many tickets a project has (read-only)."

    first, retry, read = answers[1:]
    assert (first["status"], first["replayed"]) == ("done", False)
    assert (retry["status"], retry["replayed"]) == ("done", True)
    assert retry["receipt"] == first["receipt"]
    executions = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(executions) == 1
    # The upstream got effectq's idempotency key, which no model argument could set.
    assert executions[0]["request_id"] and executions[0]["request_id"] != "req-77"
    assert (read["text"], read["is_error"]) == ("1", False) and "status" not in read
