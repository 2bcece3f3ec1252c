"""lab.net.netlink: run-time link changes over netlink leave what tc would.

The root test builds one veth pair in a throwaway namespace (no lab), shapes it with tc, changes
it over netlink, and reads it back with tc."""

from __future__ import annotations

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from lab.net import shaping
from lab.net.netlink import HostNetlink, NetlinkChangeError, _rate_bytes_s


@pytest.mark.parametrize("rate_mbit", [0.0001, 0.5, 7.25, 33.0, 1000.0, 40_000.0])
def test_the_netlink_rate_is_the_rate_tc_is_given(rate_mbit: float) -> None:
    kbit = int(shaping.rate_arg(rate_mbit).removesuffix("kbit"))
    assert _rate_bytes_s(rate_mbit) == kbit * 1000 // 8


def test_a_refusal_is_a_shaping_error_with_the_kernels_errno() -> None:
    err = NetlinkChangeError("change-class htb", "w0-w1", NetlinkError(2, "No such file"))
    assert isinstance(err, shaping.ShapingError) and err.errno == 2
    assert "w0-w1" in str(err) and "change-class htb" in str(err)


@pytest.fixture
def veth_ns(fresh_netns: int) -> int:
    """A fresh namespace with a veth pair w0-w1/w1-w0 shaped by tc; the pid that holds it."""
    pid = fresh_netns
    shaping.run(pid, ["ip", "link", "add", "w0-w1", "type", "veth", "peer", "name", "w1-w0"])
    shaping.run(pid, ["ip", "link", "set", "w0-w1", "up"])
    shaping.apply(pid, "w0-w1", shaping.Shape(100.0), netem=False)
    return pid


@pytest.mark.root
def test_netlink_changes_leave_the_tree_tc_would(veth_ns: int) -> None:
    pid = veth_ns
    with HostNetlink() as nl:
        nl.change_rate(pid, "w0-w1", 37.5)
        nl.set_leaf(pid, "w0-w1", shaping.Shape(37.5), netem=False, in_place=True)
        by_netlink = shaping.run(pid, ["tc", "-d", "class", "show", "dev", "w0-w1"])
        leaf = shaping.run(pid, ["tc", "qdisc", "show", "dev", "w0-w1"])
        assert f"limit {shaping.queue_limit(37.5)}p" in leaf
        shaping.change_rate(pid, "w0-w1", 37.5)
        assert shaping.run(pid, ["tc", "-d", "class", "show", "dev", "w0-w1"]) == by_netlink
        assert shaping.show_classes(pid, "w0-w1")[0].rate_mbit == 37.5
        with pytest.raises(NetlinkChangeError) as exc:
            nl.change_rate(pid, "lo", 5.0)  # lo has no HTB class
        assert exc.value.errno > 0
