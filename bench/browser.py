"""A headless browser for the playground page (GET /): Debian's `chromium` package driven by Playwright, for its
tests (tests/test_playground.py) and its measurements (bench/experiments/playground.py).

Playwright's own browser download needs the internet, which these machines lack, so it launches the system's
chromium by its path.  `.ci/run` installs it before `make test`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Iterator

CHROMIUM = Path("/usr/bin/chromium")
INSTALL_COMMAND = "apt-get install -y chromium"

# Injected before the page's own scripts: for each submit of the form, when it happened and, at every change of
# the output, (performance.now(), shaded tokens shown), so that a test or a measurement sees what the page showed
# and when, not what the page says of itself.
TOKEN_TIMELINE = """
window.tokenTimeline = {submitted: null, shown: []};
document.addEventListener("submit", () => {
  window.tokenTimeline = {submitted: performance.now(), shown: []};
}, true);
addEventListener("DOMContentLoaded", () => {
  const output = document.getElementById("output");
  new MutationObserver(() => {
    window.tokenTimeline.shown.push([performance.now(), output.querySelectorAll(".tok").length]);
  }).observe(output, {childList: true});
});
"""


def browser_missing() -> str | None:
    """Why no browser can run here, with what installs it; None when one can."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed: .venv/bin/pip install -r requirements-test.txt installs it"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: `{INSTALL_COMMAND}` (as root) installs it"
    return None


@contextlib.contextmanager
def chromium() -> Iterator:
    """A headless chromium (playwright.sync_api.Browser), closed on leaving the block."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser
        finally:
            browser.close()


def server_sent_events(text: str) -> list[tuple[str, dict]]:
    """A /generate stream's events, (name, data), in order."""
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events
