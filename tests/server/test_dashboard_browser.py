"""The dashboard in a real headless browser (Debian's chromium via selenium) against a live
server under a doc-burst load: the charts render, stalls and their causes appear (eager), the
document's prefill window shows and no prefill stall crosses the target (chunked, budget 64).

Screenshots go to the test's tmp folder, or to $CADENCE_DASHBOARD_SCREENSHOTS (docs/ uses
them: docs/dashboard-eager.png, docs/dashboard-chunked.png)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from browser import start_chromium, why_no_browser
from dashboard_load import DOC_TOKENS, doc_burst
from server_harness import start_server

KEY = "browser-key"
TARGET_MS = 250

pytestmark = pytest.mark.skipif(why_no_browser() is not None,
                                reason=f"no headless browser: {why_no_browser()}")


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def browser():
    driver = start_chromium()
    yield driver
    driver.quit()


def _run(browser, tmp_path_factory, policy: str, budget: int) -> dict:
    from selenium.webdriver.common.by import By

    tmp = tmp_path_factory.mktemp(f"browser-{policy}")
    server = start_server(str(tmp), "--engine-factory", "timed_engine:build_timed_engine",
                          "--policy", policy, "--max-num-batched-tokens", str(budget),
                          "--target-itl-ms", str(TARGET_MS), api_key=KEY)
    try:
        browser.get(server.base_url + f"/dashboard?key={KEY}")
        _wait(lambda: browser.find_element(By.ID, "status").text == "live", 20, "SSE to connect")
        load = threading.Thread(target=doc_burst, args=(server.base_url, server.headers()))
        load.start()
        load.join(60)
        assert not load.is_alive()
        # The streams' last tokens reached the page.
        _wait(lambda: browser.execute_script(
            "return state.steps.length && state.steps.every(s => s.num_running >= 0) "
            "&& state.ticks.size >= 4"), 15, "steps and token ticks on the page")
        # Everything received so far is drawn (the page redraws within 0.5 s of new data).
        _wait(lambda: browser.execute_script(
            "return !state.dirty && Number(document.body.dataset.redraws || 0) > 0"), 10,
              "the page to draw what it received")
        rows = [(r.get_attribute("data-cause"), r.find_element(By.CLASS_NAME, "who").text)
                for r in browser.find_elements(By.CSS_SELECTOR, "#stall-table tbody tr")]
        shot_dir = os.environ.get("CADENCE_DASHBOARD_SCREENSHOTS") or str(tmp)
        os.makedirs(shot_dir, exist_ok=True)
        shot = os.path.join(shot_dir, f"dashboard-{policy}.png")
        browser.save_screenshot(shot)
        return {
            "rows": rows, "shot": shot,
            "bars": len(browser.find_elements(By.CSS_SELECTOR, "#steps .bars .point")),
            "windows": browser.execute_script(
                "return [...state.prefill.values()].filter(w => w.prompt >= 256).length"),
            "plots": len(browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")),
            "interference": browser.find_element(By.ID, "interference-table").text,
        }
    finally:
        server.stop()


def test_eager_stalls_and_their_cause_show_in_the_browser(browser, tmp_path_factory):
    page = _run(browser, tmp_path_factory, "eager", 512)
    assert page["plots"] == 3 and page["bars"] > 10
    assert page["windows"] == 1  # the document's prefill window is shaded
    prefill_rows = [who for cause, who in page["rows"] if cause == "prefill"]
    assert len(prefill_rows) >= 3, page["rows"]
    for who in prefill_rows:
        assert f"prompt {DOC_TOKENS} tok" in who
    assert str(DOC_TOKENS) in page["interference"]
    assert os.path.getsize(page["shot"]) > 10_000


def test_chunked_shows_the_window_without_prefill_stalls(browser, tmp_path_factory):
    page = _run(browser, tmp_path_factory, "chunked", 64)
    assert page["plots"] == 3 and page["windows"] == 1
    assert not [who for cause, who in page["rows"] if cause == "prefill"], page["rows"]
    assert os.path.getsize(page["shot"]) > 10_000
