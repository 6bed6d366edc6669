"""An existing MCP server (FastMCP, streamable HTTP) for the proxy test:
``python upstream_server.py PORT LOG``. ``create_ticket`` has a side effect (a line in LOG
per execution, the ground truth); ``count_tickets`` only reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP

PORT, LOG = int(sys.argv[1]), Path(sys.argv[2])
app = FastMCP("tickets", host="127.0.0.1", port=PORT, log_level="WARNING")


def _lines() -> list[str]:
    return LOG.read_text().splitlines() if LOG.exists() else []


@app.tool()
def create_ticket(project: str, title: str, body: str = "", request_id: str = "") -> dict[str, str]:
    """Open a ticket in a project."""
    number = len(_lines()) + 1
    with LOG.open("a") as log:
        log.write(json.dumps({"project": project, "title": title, "request_id": request_id}) + "\n")
    return {"ticket": f"{project}-{number}", "request_id": request_id}


@app.tool()
def count_tickets(project: str) -> str:
    """How many tickets a project has (read-only)."""
    return str(sum(json.loads(line)["project"] == project for line in _lines()))


if __name__ == "__main__":
    app.run(transport="streamable-http")
