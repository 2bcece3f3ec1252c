"""docs/api.md documents every option of crew.Averager and every variable a job reads, so the
reference cannot fall behind the code."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import crew

REPO = Path(__file__).resolve().parents[1]
API = (REPO / "docs" / "api.md").read_text(encoding="utf-8")


def _section(heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", API, re.M | re.S)
    assert match, f"docs/api.md has no '## {heading}' section"
    return match.group(1)


def test_every_averager_parameter_is_in_the_signature_and_has_its_own_entry():
    reference = _section("API reference")
    signature = re.search(r"```python\n(crew\.Averager\(.*?\))\n```", reference, re.S)
    assert signature, "the API reference opens with Averager's signature"
    documented_signature = signature.group(1)
    params = [p for p in inspect.signature(crew.Averager.__init__).parameters if p != "self"]
    entries = re.findall(r"^\* ((?:`\w+`(?: \(\w+\))?(?:, )?)+):", reference, re.M)
    described = {name for entry in entries for name in re.findall(r"`(\w+)`", entry)}
    for name in params:
        assert re.search(rf"\b{name}\b", documented_signature), f"{name} not in the signature"
        assert name in described, f"{name} has no '* `{name}`: ...' entry in the API reference"
    # The same names, in the same order, with the code's defaults.
    as_def = ast.parse("def f" + documented_signature.removeprefix("crew.Averager") + ": pass")
    args = as_def.body[0].args  # type: ignore[attr-defined]
    documented = {a.arg: None for a in args.args} | {
        a.arg: ast.literal_eval(d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    }
    assert list(documented) == params
    for p in inspect.signature(crew.Averager.__init__).parameters.values():
        if p.default is not inspect.Parameter.empty:
            assert documented[p.name] == p.default, (p.name, documented[p.name], p.default)


def test_every_variable_a_job_reads_is_in_the_environment_table():
    table = _section("API reference").split("### Environment", 1)[1].split("###", 1)[0]
    sources = [REPO / "crew" / "averager.py", REPO / "crew" / "runtime" / "launch.py"]
    read = {
        v for path in sources for v in re.findall(r"(?<![.\w])CREW_[A-Z_]+\b", path.read_text())
    }
    assert {"CREW_DATA_PORT", "CREW_CONTROL_PORT", "CREW_SECRET"} <= read
    missing = sorted(v for v in read if f"`{v}" not in table)
    assert not missing, f"not in docs/api.md's environment table: {missing}"


def test_the_firewall_rules_name_every_port_a_job_listens_on():
    rules = _section("Ports and firewalls")
    for port in ("--master-port", "MASTER_PORT + 1", "CREW_CONTROL_PORT", "CREW_DATA_PORT"):
        assert port in rules, port
