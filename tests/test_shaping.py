"""lab.net.shaping's command batches: read-only `ip` commands in this process's own namespace,
and (root) a batch that changes a throwaway one."""

from __future__ import annotations

import shutil

import pytest

from lab.net import shaping

pytestmark = pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip")


def test_a_failing_batch_names_the_command_that_failed() -> None:
    good = ["ip", "link", "show", "lo"]
    bad = ["ip", "link", "show", "crwnosuchdev0"]
    with pytest.raises(shaping.ShapingError) as exc:
        shaping.run_batch(None, "ip", [good, bad, good])
    assert exc.value.argv == bad
    assert "crwnosuchdev0" in str(exc.value)


@pytest.mark.root
def test_a_good_batch_runs_every_line_in_order(fresh_netns: int) -> None:
    pid = fresh_netns  # a throwaway namespace: the batch changes it
    shaping.run_batch(
        pid,
        "ip",
        [
            ["ip", "link", "add", "crwd0", "type", "veth", "peer", "name", "crwd1"],
            ["ip", "addr", "add", "10.77.0.1/32", "dev", "crwd0"],  # needs the line before
            ["ip", "link", "set", "crwd0", "up"],
        ],
    )
    shown = shaping.run(pid, ["ip", "-o", "addr", "show", "dev", "crwd0"])
    assert "10.77.0.1/32" in shown
    assert "UP" in shaping.run(pid, ["ip", "-o", "link", "show", "crwd0"])


def test_an_empty_batch_starts_no_process() -> None:
    # No process can have this pid: running anything "in its namespace" would fail (mnexec).
    with open("/proc/sys/kernel/pid_max") as f:
        no_such_pid = int(f.read()) + 1
    with pytest.raises(shaping.ShapingError):
        shaping.run(no_such_pid, ["ip", "link", "show", "lo"])
    shaping.run_batch(no_such_pid, "tc", [])


@pytest.mark.parametrize(
    "argv",
    [
        ["tc", "qdisc", "show"],  # another tool
        ["ip", "link", "show", "two words"],
        ["ip", "link", "show", ""],
        ["ip", "link", "show", "#comment"],
        ["ip", "link", "show", '"quoted"'],
    ],
)
def test_commands_a_batch_line_cannot_carry_are_refused(argv: list[str]) -> None:
    with pytest.raises(ValueError):
        shaping.run_batch(None, "ip", [argv])


def test_apply_commands_install_root_class_and_leaf_in_that_order() -> None:
    cmds = shaping.apply_commands("w0-w1", shaping.Shape(100.0), netem=False)
    assert [c[:3] for c in cmds] == [
        ["tc", "qdisc", "replace"],
        ["tc", "class", "replace"],
        ["tc", "qdisc", "replace"],
    ]
    assert "htb" in cmds[0] and "100000kbit" in cmds[1] and "pfifo" in cmds[2]
    assert cmds[2] == shaping.leaf_command("w0-w1", shaping.Shape(100.0), netem=False)
