"""A headless Chromium on the lab's dashboard, for the first-paint benchmark and the e2e test.

Debian's ``chromium`` (installed by ``lab/setup.sh``) driven by Playwright (a test extra). The
flags keep Chromium off the network (this machine refuses outside connections, and Chromium
would otherwise retry its background services many times a second) and let it run as root.

Chromium watches the host's interfaces and aborts requests in flight with
``ERR_NETWORK_CHANGED`` when one appears, which Mininet does while it builds the lab. A page
opened during the build can therefore come up blank (its scripts failed to load) and stay
blank, so :func:`open_dashboard` retries until the page's title is drawn.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--no-sandbox",  # root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
TITLE = "h1:has-text('CREW Lab')"
BLANK_PAGE_S = 15.0  # a title not drawn by then will not be: the page's scripts failed to load

# The dashboard's "Link utilisation now" table (dashboard.app.Page.network).
LINK_COLUMNS = ["link", "Mbit/s", "rate Mbit/s", "util %", "state"]
_READ_TABLES = """() => [...document.querySelectorAll(
    "[data-testid='stMain'] [data-testid='stTable']")]
  .map(t => [...t.querySelectorAll('tr')]
    .map(r => [...r.querySelectorAll('th, td')].map(c => c.innerText.trim())))"""

# The page scrolls inside its main area; the viewport must grow to it for a whole-page shot.
_CONTENT_HEIGHT = """() => Math.max(...["stMain", "stSidebarContent"].map(
    id => document.querySelector(`[data-testid='${id}']`)?.scrollHeight || 0))"""


class BrowserError(RuntimeError):
    """The browser or Playwright is missing, or the page did not come up."""


def launch(playwright: Any) -> Any:
    """Debian's Chromium, headless, through a started ``sync_playwright()``."""
    if not CHROMIUM.exists():
        raise BrowserError(f"no Chromium at {CHROMIUM}: run `sudo bash lab/setup.sh`")
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))


def sync_playwright() -> Any:
    """``playwright.sync_api.sync_playwright``, or a BrowserError saying how to install it."""
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError as exc:
        raise BrowserError(
            "Playwright is not installed: it comes with the test extras (`lab/setup.sh`)"
        ) from exc
    return start()


def open_dashboard(page: Any, url: str, wait_s: float, *, retry_every_s: float = 1.0) -> int:
    """Load ``url`` until the dashboard's title is drawn, retrying refused connections and
    blank pages for at most ``wait_s`` seconds; return the number of loads it took, or raise
    BrowserError."""
    from playwright.sync_api import Error as PlaywrightError

    deadline = time.monotonic() + wait_s
    last = "no attempt"
    for attempt in range(1, max(1, int(wait_s / retry_every_s)) + 2):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            page.goto(url, timeout=max(1.0, left) * 1000, wait_until="commit")
            page.locator(TITLE).wait_for(timeout=max(1.0, min(left, BLANK_PAGE_S)) * 1000)
            return attempt
        except PlaywrightError as exc:
            last = str(exc).splitlines()[0]
            page.wait_for_timeout(retry_every_s * 1000)
    raise BrowserError(f"the dashboard at {url} did not come up within {wait_s:.0f} s ({last})")


def screenshot(page: Any, path: Path) -> None:
    """The whole page, sidebar and main area, however far they scroll."""
    height = page.evaluate(_CONTENT_HEIGHT)
    page.set_viewport_size({"width": page.viewport_size["width"], "height": int(height) + 40})
    page.wait_for_timeout(1000)  # let the charts re-layout to the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


def link_table(page: Any) -> dict[str, dict[str, str]] | None:
    """The "Link utilisation now" table as {link label: {column: text}}, or None if not shown.

    Read in one evaluate call: the panel re-renders every few seconds, so element handles
    taken one by one could come from different renders.
    """
    for rows in page.evaluate(_READ_TABLES):
        if rows and rows[0] == LINK_COLUMNS:
            width = len(LINK_COLUMNS)
            return {
                r[0]: dict(zip(LINK_COLUMNS, r, strict=True)) for r in rows[1:] if len(r) == width
            }
    return None


def util_pct(row: dict[str, str]) -> float | None:
    """A link-table row's utilisation in percent; None for "n/a" (no recent sample)."""
    m = re.fullmatch(r"([0-9.]+)%", row["util %"])
    return float(m.group(1)) if m else None


def free_port() -> int:
    """A TCP port free on loopback now (another process could take it before Streamlit does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
