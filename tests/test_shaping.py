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
        ["tc", "filter", "add"],
    ]
    assert "htb" in cmds[0] and "100000kbit" in cmds[1] and "pfifo" in cmds[2]
    assert cmds[2] == shaping.leaf_command("w0-w1", shaping.Shape(100.0), netem=False)
    assert cmds[3] == shaping.ack_filter_command("w0-w1", add=True)


def test_the_ack_filter_sends_short_pure_acks_to_htbs_direct_queue() -> None:
    cmd = shaping.ack_filter_command("w0-w1", add=True)
    assert cmd[cmd.index("flowid") + 1] == "1:0"  # the qdisc's own handle: its direct queue
    matches = " ".join(cmd[cmd.index("u32") + 1 : cmd.index("flowid")]).split("match ")[1:]
    assert [m.strip() for m in matches] == [
        "ip protocol 6 0xff",  # TCP
        "u8 0x05 0x0f at 0",  # a 20-byte IPv4 header, so the TCP flags sit at byte 33
        "u16 0x0000 0xff80 at 2",  # total length below 128 bytes
        "u8 0x10 0xff at 33",  # ACK and no other flag: no data pushed, no SYN or FIN
    ]
    assert shaping.ack_filter_command("w0-w1", add=False) == [
        *["tc", "filter", "del", "dev", "w0-w1", "parent", "1:", "protocol", "ip"],
        *["pref", shaping.ACK_FILTER_PREF, "u32"],
    ]


def test_a_netem_leaf_keeps_its_acks_and_a_change_of_kind_moves_the_filter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # netem delays every packet: ACKs sent direct would skip the link's delay.
    delayed = shaping.Shape(100.0, delay_ms=20)
    assert [c[:3] for c in shaping.apply_commands("w0-w1", delayed, netem=True)][-1] == [
        "tc",
        "qdisc",
        "replace",
    ]
    batches: list[list[list[str]]] = []
    monkeypatch.setattr(shaping, "run_batch", lambda pid, tool, cmds: batches.append(cmds))
    shaping.set_leaf(1, "w0-w1", delayed, netem=True)  # pfifo -> netem
    shaping.set_leaf(1, "w0-w1", shaping.Shape(100.0), netem=True)  # netem -> pfifo
    to_netem, to_pfifo = batches
    assert [c[1:3] for c in to_netem] == [["filter", "del"], ["qdisc", "del"], ["qdisc", "add"]]
    assert "netem" in to_netem[2]
    assert [c[1:3] for c in to_pfifo] == [["qdisc", "del"], ["qdisc", "add"], ["filter", "add"]]
    assert "pfifo" in to_pfifo[1]
