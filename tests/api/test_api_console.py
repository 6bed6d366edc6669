"""The operator console in headless Chromium (Debian's, driven by Playwright): an UNKNOWN
effect whose delivery is held back shows in the work queue, an operator resolves it through
the page with a reason, and the held message's next delivery runs it — once."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dedupe import State
from tests.api.conftest import ROLES, Api
from tests.support.ledgers import poll
from tests.support.requires import need_binary, unavailable
from tests.support.stack import DRAINED, broker_messages, wait_for, wait_states
from workers import get_tool, runtime
from workers.dev.local import LocalStack

# Chromium's background services would try the network this machine does not have.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
CALL = {"tool": "send_email", "scope": "evt-night-1", "args": {"recipient": "night@example.com"}}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium = need_binary("chromium", "apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (pip install -e '.[api-test]')")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _held_unknown(api: Api, live: LocalStack) -> str:
    """Submit through the API, then play a holder that died right after its claim and a
    reconciler whose lookups kept failing: the effect is UNKNOWN, its message still queued."""
    with api.client("shop") as c:
        submitted = c.post("/v1/tool-calls", json=CALL)
    assert submitted.status_code == 202, submitted.text
    key: str = submitted.json()["key"]
    ledger = runtime.ledger()
    effect = get_tool("send_email").derive(CALL["scope"], CALL["args"])  # type: ignore[arg-type]
    ledger.claim(effect, lease_s=0.05, holder="dead/1")
    takeover = poll(lambda: ledger.takeover(key, lease_s=30, holder="r/1"), bool)
    assert takeover is not None
    ledger.mark_unknown(key, takeover.token, reason="lookup unavailable 5 times")
    live.start_workers(1, 2)
    # Every delivery is held back (retried later), none executes.
    wait_for(lambda: broker_messages(live)["delayed"] == 1, what="delivery held back")
    assert live.stats()["total"] == 0
    return key


def test_an_operator_resolves_an_unknown_effect_in_the_console(
    api: Api, live: LocalStack, browser: Any, tmp_path: Path
) -> None:
    key = _held_unknown(api, live)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{api.url}/console")
    assert page.url.endswith("/console/login")
    page.fill("input[name=token]", ROLES["sre-ana"][0])
    page.click("main form button")
    page.wait_for_url(f"{api.url}/console")
    assert page.inner_text("h2 >> nth=0") == "Needs an operator: UNKNOWN (1)"
    row = page.locator("tr", has_text="send_email")
    assert "lookup unavailable 5 times" in row.inner_text()
    page.screenshot(path=str(tmp_path / "console-queue.png"), full_page=True)

    row.locator("a.key").click()
    page.wait_for_url(f"{api.url}/console/effects/{key}")
    assert page.inner_text("#state") == "UNKNOWN"
    page.check("input[value=not_executed]")
    page.click("#resolve button")  # the browser refuses it: a reason is required
    assert page.url == f"{api.url}/console/effects/{key}"
    assert runtime.ledger().get(key).state is State.UNKNOWN  # type: ignore[union-attr]
    page.fill("#resolve input[name=reason]", "provider support ticket 42: never sent")
    page.screenshot(path=str(tmp_path / "console-unknown.png"), full_page=True)
    page.click("#resolve button")
    page.wait_for_url(f"{api.url}/console/effects/{key}?ok=resolve")
    assert "resolve: done" in page.inner_text("p.ok")

    # Resolved as not executed: the held message's next delivery executes it, once.
    [record] = wait_states(runtime.ledger(), [key], timeout=60).values()
    wait_for(lambda: broker_messages(live) == DRAINED, what="acked", timeout=60)
    assert live.stats()["executions"] == {key: 1}
    assert record is not None
    assert [h.state for h in record.history][-3:] == ["FAILED", "CLAIMED", "DONE"]
    [entry] = runtime.ledger().audit_log()
    assert (entry["action"], entry["actor"], entry["key"]) == ("resolve_failed", "sre-ana", key)
    assert entry["reason"] == "provider support ticket 42: never sent"

    page.reload()
    assert page.inner_text("#state") == "DONE"
    story = page.inner_text("main")
    assert "resolve_failed by sre-ana: provider support ticket 42: never sent" in story
    assert "lookup unavailable 5 times" in story and '"to": "night@example.com"' in story
    page.screenshot(path=str(tmp_path / "console-effect.png"), full_page=True)
    page.goto(f"{api.url}/console")
    assert page.inner_text("h2 >> nth=0") == "Needs an operator: UNKNOWN (0)"
    # `EFFECTQ_CONSOLE_SCREENSHOT=docs/console.png` refreshes the README's picture.
    if os.environ.get("EFFECTQ_CONSOLE_SCREENSHOT"):
        shutil.copyfile(tmp_path / "console-unknown.png", os.environ["EFFECTQ_CONSOLE_SCREENSHOT"])

    # Campaign progress, reached from the header's form.
    spec = {"campaign_id": "night-notice", "tool": "send_email",
            "recipients": ["a@example.com", "b@example.com"]}  # fmt: skip
    with api.client("shop") as c:
        assert c.post("/v1/campaigns", json=spec).status_code == 202
    page.fill("header input[name=id]", "night-notice")
    page.click("header nav button")
    page.wait_for_url(f"{api.url}/console/campaigns?id=night-notice")
    wait_for(lambda: page.reload() and "2 of 2 done" in page.inner_text("main"), what="sent")
    assert page.locator("td", has_text="b@example.com").count() == 1
    page.screenshot(path=str(tmp_path / "console-campaign.png"), full_page=True)
    page.close()
