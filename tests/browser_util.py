"""Drive the system's headless Chromium (Debian `chromium` + `chromium-driver`) for report tests.

Never downloads a browser or a driver: Selenium is pointed at /usr/bin/chromium and
/usr/bin/chromedriver, which `.ci/run` installs with apt. Before any page script runs, a DevTools
hook replaces `alert`/`confirm`/`prompt` with recorders and records uncaught errors and CSP
violations, so a test can prove that a log line such as `<script>alert(1)</script>` ran nothing.
"""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-extensions",
    "--no-default-browser-check",
    "--hide-scrollbars",
)

# Runs in every document before its own scripts (DevTools, so the page's CSP does not apply).
TRAPS = """
window.__pm = {dialogs: [], errors: [], csp: []};
window.alert = function (m) { window.__pm.dialogs.push('alert:' + String(m)); };
window.confirm = function (m) { window.__pm.dialogs.push('confirm:' + String(m)); return false; };
window.prompt = function (m) { window.__pm.dialogs.push('prompt:' + String(m)); return null; };
window.addEventListener('error', function (e) { window.__pm.errors.push(String(e.message)); });
window.addEventListener('unhandledrejection', function (e) { window.__pm.errors.push('unhandled: ' + String(e.reason)); });
document.addEventListener('securitypolicyviolation', function (e) {
  window.__pm.csp.push(e.violatedDirective + ' ' + e.blockedURI);
});
"""


def unavailable_reason() -> str | None:
    """Why browser tests cannot run here, or None when they can.

    Only a missing browser is a reason to skip; with Chromium present, a missing driver or
    Selenium is an installation error that `headless_chromium` reports.
    """
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is absent (CI installs the Debian packages chromium and chromium-driver)"
    return None


@dataclass
class PageLoad:
    url: str
    state: str  # the report's data-timeline attribute: ready, empty, or "" if never set
    ready_ms: float | None  # performance mark pm-timeline-ready, ms after navigation start
    console: list[dict] = field(default_factory=list)  # every browser console entry
    traps: dict = field(default_factory=dict)  # dialogs, errors, csp recorded by TRAPS
    resources: list[str] = field(default_factory=list)  # URLs the page fetched (must be none)

    @property
    def console_errors(self) -> list[str]:
        return [entry["message"] for entry in self.console if entry.get("level") == "SEVERE"]


class Browser:
    def __init__(self, driver):
        self.driver = driver

    def load(self, path: Path, timeout: float = 60.0) -> PageLoad:
        self.driver.get_log("browser")  # drop entries of an earlier page
        url = Path(path).resolve().as_uri()
        self.driver.get(url)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.driver.execute_script(
                "var e = document.getElementById('timeline-error');"
                "return (e && e.textContent) ? 'error' : (document.body ? document.body.getAttribute('data-timeline') || '' : '');"
            )
            if state in ("ready", "empty", "error"):
                break
            time.sleep(0.05)
        ready = self.driver.execute_script(
            "var m = performance.getEntriesByName('pm-timeline-ready'); return m.length ? m[0].startTime : null;"
        )
        traps = self.driver.execute_script("return window.__pm || {};")
        resources = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(function (r) { return r.name; });"
        )
        return PageLoad(url, state, ready, self.driver.get_log("browser"), traps, resources)

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def visible(self, selector: str) -> bool:
        return bool(self.driver.execute_script(
            "var n = document.querySelector(arguments[0]); if (!n) return false;"
            "var r = n.getBoundingClientRect(), s = getComputedStyle(n);"
            "return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none';",
            selector,
        ))

    def screenshot(self, out: Path, max_height: int = 8000) -> Path:
        """A PNG of the whole page (up to max_height CSS pixels)."""
        metrics = self.driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        shot = self.driver.execute_cdp_cmd(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )
        out = Path(out)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1000):
    """A Browser on a fresh profile directory, removed afterwards."""
    if not CHROMEDRIVER.exists():
        raise RuntimeError(f"{CHROMIUM} is installed but {CHROMEDRIVER} is not: apt-get install chromium-driver")
    from selenium import webdriver  # the test extra; never downloads a driver with the paths given below
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager, should anything call it, downloads nothing
    profile = tempfile.mkdtemp(prefix="pm-chromium-")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TRAPS})
        yield Browser(driver)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
