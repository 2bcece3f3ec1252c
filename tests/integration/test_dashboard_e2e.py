"""End to end in a real browser: a live lab, its dashboard in Chromium, and a link cut by click.

The test starts a small lab with the dashboard on a free loopback port, opens the page with
Playwright driving Debian's ``chromium``, waits until the link-utilisation table shows traffic,
cuts the busiest link through the sidebar controls and then checks, on the page alone, that the
cut reached the event log and that the link reads DOWN with its utilisation near zero.

The lab applies dashboard commands only when ``LabRun.poll`` runs, so a background thread polls
every half second while the browser works in the test thread. A screenshot of the page at the
end goes to ``test-artifacts/dashboard-e2e.png`` for a human to look at.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lab.net.preflight import check
from lab.orchestrate import browser
from lab.orchestrate.browser import CHROMIUM, free_port, link_table, util_pct
from lab.orchestrate.runner import REPO, LabRun, RunOptions
from lab.spec.topology import load_topology

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin"),
]

SMALL = REPO / "topologies" / "small.yaml"
ARTIFACT = REPO / "test-artifacts" / "dashboard-e2e.png"
POLL_EVERY_S = 0.5
PAGE_WAIT_S = 90.0  # the dashboard starts beside three torch imports on two cores
TRAFFIC_WAIT_S = 150.0  # workers import torch, load data, and only then form groups
CUT_WAIT_S = 20.0
IDLE_UTIL_PCT = 5.0
ACTION_TIMEOUT_S = 60.0

T = TypeVar("T")


# -- the lab side --------------------------------------------------------------------------------


class Poller:
    """Calls ``lab.poll()`` every ``POLL_EVERY_S`` in a daemon thread until stopped.

    An exception in ``poll`` stops the thread and is re-raised by ``stop``, so a lab that broke
    fails the test instead of leaving commands pending unseen.
    """

    def __init__(self, lab: LabRun, max_s: float = 900.0):
        self._lab = lab
        self._max_s = max_s
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="lab-poll", daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self._max_s
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                self._lab.poll()
                self._stop.wait(POLL_EVERY_S)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread in stop()
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._error is not None:
            raise self._error


@contextmanager
def polled(lab: LabRun) -> Iterator[Poller]:
    poller = Poller(lab)
    poller.start()
    try:
        yield poller
    finally:
        poller.stop()


def lab_logs(lab: LabRun) -> str:
    return "\n".join(
        f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
        for p in sorted((lab.run_dir / "logs").glob("*"))
    )


# -- the browser side ----------------------------------------------------------------------------


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str, page: Any) -> T:
    """Poll ``predicate`` (in the page's event loop) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        page.wait_for_timeout(500)


def busiest(page: Any) -> tuple[str, float] | None:
    table = link_table(page)
    if not table:
        return None
    loads = [(label, util_pct(r)) for label, r in table.items() if r["state"] == "up"]
    loads = [(label, u) for label, u in loads if u is not None and u > 0]
    return max(loads, key=lambda lu: lu[1]) if loads else None


def cut_down(page: Any, label: str) -> dict[str, str] | None:
    row = (link_table(page) or {}).get(label)
    if row is None:
        return None
    u = util_pct(row)
    idle = u is not None and u < IDLE_UTIL_PCT
    return row if row["state"] == "DOWN" and idle else None


def event_log_text(page: Any) -> str:
    """The event log's rows (all of them: the box scrolls, the table is whole in the DOM)."""
    box = page.locator(".st-key-event_log")
    return (box.first.text_content() or "") if box.count() else ""


def compute_share(page: Any) -> str | None:
    """The compute-utilisation metric's value once its panel has drawn its chart."""
    if not page.locator(".st-key-compute_shares .main-svg").count():
        return None
    metric = page.locator("[data-testid='stMetric']", has_text="compute utilisation")
    text = metric.first.inner_text() if metric.count() else ""
    value = text.strip().splitlines()[-1] if text.strip() else ""
    return value if value.endswith("%") else None


def set_number(page: Any, key: str, value: int) -> None:
    box = page.locator(f".st-key-{key} input")
    box.fill(str(value))
    box.press("Tab", no_wait_after=True)  # commits the value into the form, not submitting it


# -- the test ------------------------------------------------------------------------------------


def test_cutting_the_busiest_link_from_the_page(tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    topo = load_topology(SMALL)
    caps = check(topo)
    port = free_port()
    opts = RunOptions(
        p=2,
        width=256,
        depth=2,
        part_bytes=64 << 10,
        dashboard=True,
        dashboard_port=port,
        log_level="WARNING",
    )
    with (
        LabRun(topo, caps, opts, tmp_path / "run", state_dir=tmp_path / "state") as lab,
        polled(lab),
        sync_playwright() as pw,
    ):
        chromium = browser.launch(pw)
        try:
            page = chromium.new_page(viewport={"width": 1600, "height": 1100})
            # Generous: the page redraws its charts beside three training workers on two cores.
            page.set_default_timeout(ACTION_TIMEOUT_S * 1000)
            try:
                browser.open_dashboard(page, lab.dashboard_url, PAGE_WAIT_S)
                label, before = wait_until(
                    lambda: busiest(page), TRAFFIC_WAIT_S, "a link carrying traffic", page
                )
                src, dst = (int(x) for x in label.split("→"))

                set_number(page, "cut_link_src", src)
                set_number(page, "cut_link_dst", dst)
                page.locator(".st-key-cut_link_confirm label").click()  # a destructive control
                page.locator(".st-key-cut_link_submit button").click(no_wait_after=True)
                sent = page.locator("[data-testid='stAlertContentSuccess']")
                sent.wait_for(timeout=CUT_WAIT_S * 1000)
                sent_text = sent.first.inner_text()

                row = wait_until(
                    lambda: cut_down(page, label), CUT_WAIT_S, f"{label} to read DOWN, idle", page
                )
                wanted = f"cut link {src}→{dst}"
                events = wait_until(
                    lambda: (t := event_log_text(page)) and wanted in t and t,
                    CUT_WAIT_S,
                    f"'{wanted}' in the event log",
                    page,
                )
                share = wait_until(
                    lambda: compute_share(page), CUT_WAIT_S, "the compute utilisation panel", page
                )
            except Exception as exc:
                browser.screenshot(page, ARTIFACT)
                raise AssertionError(f"{exc}\nlab logs:\n{lab_logs(lab)}") from exc
            browser.screenshot(page, ARTIFACT)
        finally:
            chromium.close()

    assert before > 0, f"{label} was picked as busiest at {before}%"
    assert f"cut link {src}→{dst}" in sent_text, sent_text
    assert row["state"] == "DOWN" and util_pct(row) is not None
    assert util_pct(row) < IDLE_UTIL_PCT, row
    assert f"cut link {src}→{dst} (command #1)" in events, events
    assert 0 < float(share.rstrip("%")) <= 100, share  # the workers' reported time split
    assert ARTIFACT.stat().st_size > 10_000, "the screenshot is empty"
