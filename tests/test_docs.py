"""The documentation a newcomer reads: short, its links resolve, its test commands are where the
tools that parse them look, and it speaks of the product, not of its making."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from lab.spec.scenario import parse_scenario
from lab.spec.topology import parse_topology

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
HISTORY = re.compile(r"session [0-9]+|issue [0-9]+", re.I)


def markdown_links(text: str) -> list[str]:
    """Relative link targets of a markdown text (web addresses and anchors left out)."""
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def fenced_after(text: str, marker: str) -> str:
    """The first line of the fenced code block right after ``marker``'s line."""
    match = re.search(rf"^{re.escape(marker)}\n```[a-z]*\n(.+?)\n```", text, re.M)
    assert match, f"no fenced code block right after {marker}"
    return match.group(1)


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    links = markdown_links(path.read_text(encoding="utf-8"))
    missing = [t for t in links if not (path.parent / t).exists()]
    assert not missing, f"{path.relative_to(REPO)} links to missing files: {missing}"


def test_the_link_reader_sees_relative_links_only() -> None:
    text = "[a](docs/x.md) [b](https://e.org/y) [c](#anchor) [d](y.md#part) ![e](p.png)"
    assert markdown_links(text) == ["docs/x.md", "y.md", "p.png"]


def test_the_readme_gives_a_quick_and_a_full_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    quick = fenced_after(text, "<!-- quick-tests -->")
    full = fenced_after(text, "<!-- full-tests -->")
    assert "-m pytest" in quick and "not slow" in quick
    assert "-m pytest" in full and "not slow" not in full


def test_the_tours_topology_and_scenario_are_valid() -> None:
    """The README's own examples of a topology and a scenario load, as the tour says they do."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    topology, scenario = (yaml.safe_load(b) for b in blocks)
    spec = parse_topology(topology)
    assert spec.n == 5 and spec.link(0, 2).rate_mbit == 80 and spec.link(2, 0).rate_mbit == 55
    steps = parse_scenario(scenario, n=8).steps
    assert [s.trigger.value for s in steps] == sorted(s.trigger.value for s in steps)
    assert len(steps) == len(scenario["steps"])


def test_product_text_tells_no_history() -> None:
    paths = [README, *DOCS]
    paths += [p for pkg in ("crew", "lab", "dashboard") for p in sorted((REPO / pkg).rglob("*.py"))]
    found = [
        f"{p.relative_to(REPO)}:{n}: {m.group(0)}"
        for p in paths
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if (m := HISTORY.search(line))
    ]
    assert not found, "\n".join(found)
