"""The emulated network: mesh, shaping, cuts, counters, teardown and leftover cleanup.

Tests marked ``root`` build a real 3-worker lab (topologies/small.yaml) in a fresh state
directory with a unique tag and a management subnet of their own, and always tear it down.
The unmarked tests at the end cover the pure helpers and run anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crew.runtime.rundb import RunDB
from lab.bench.rawtcp import raw_move
from lab.check import schedule
from lab.net import cleanup, shaping
from lab.net.goodput import sink_argv, source_argv
from lab.net.mesh import LabError, LabNetwork
from lab.net.monitor import LinkMonitor
from lab.net.preflight import Capabilities, ImpairmentMode, capabilities, describe
from lab.spec.topology import Impairment, LinkSpec, load_topology

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "topologies" / "small.yaml"
# Not the default 198.19.255.0/24, so a lab someone is running on this machine is not in the way.
TEST_MGMT = "198.19.250.0/24"
SAMPLE_WAIT_S = 10.0  # for the link monitor (0.2 s period) to sample a finished transfer

# Runs inside a lab host: a UDP receiver that counts datagrams. argv: addr port expected limit_s
# It ends as soon as ``expected`` have arrived; otherwise once told (a line on stdin) that the
# sender has finished and then QUIET_S passes without a datagram, or after limit_s in all.
# Datagrams of a finished sender are delivered or dropped within milliseconds on these links.
UDP_RECV = textwrap.dedent("""
    import select, socket, sys, time
    QUIET_S = 0.3
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], int(sys.argv[2])))
    expected, limit = int(sys.argv[3]), float(sys.argv[4])
    print("ready", flush=True)
    n, sender_done, last = 0, False, time.monotonic()
    end = last + limit
    for _ in range(expected + int(limit / 0.05) + 1):
        now = time.monotonic()
        if n >= expected or now >= end or (sender_done and now - last >= QUIET_S):
            break
        ready, _, _ = select.select([s, sys.stdin], [], [], 0.05)
        if s in ready:
            s.recv(2048)
            n, last = n + 1, time.monotonic()
        if sys.stdin in ready and not sender_done:
            sys.stdin.readline()
            sender_done, last = True, max(last, time.monotonic())
    print(n, flush=True)
""")
# UDP sender: argv: addr port count
UDP_SEND = textwrap.dedent("""
    import socket, sys, time
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(int(sys.argv[3])):
        s.sendto(b"x" * 100, (sys.argv[1], int(sys.argv[2])))
        time.sleep(0.01)
""")


def _lab(state_dir: Path, tag: str | None = None) -> LabNetwork:
    return LabNetwork(
        load_topology(SMALL),
        tag=tag or "t" + secrets.token_hex(2),
        state_dir=state_dir,
        mgmt_subnet=TEST_MGMT,
    )


@pytest.fixture
def net(tmp_path: Path) -> Iterator[LabNetwork]:
    with _lab(tmp_path / "state") as lab:
        yield lab


def transfer(net, i: int, j: int, seconds: float = 0.3, port: int = 17000) -> dict:
    """One goodput transfer i -> j over the identity addresses; the sink's JSON result."""
    return goodput(net, i, f"{net.identity_address(j)}:{port}", seconds, sink_host=j)


def goodput(net, i: int, addr: str, seconds: float, *, sink_host: int | None) -> dict:
    """One goodput transfer from host i to a sink on ``addr``, in host ``sink_host``'s
    namespace (None: the root namespace, where the coordinator runs); the sink's JSON result."""
    argv = sink_argv(addr, seconds, "--skip", "0")
    opts: dict = dict(stdout=subprocess.PIPE, text=True, cwd=REPO)
    sink = (
        subprocess.Popen(argv, **opts) if sink_host is None else net.popen(sink_host, argv, **opts)
    )
    try:
        assert "listening" in sink.stdout.readline()
        src = net.popen(i, source_argv(addr, seconds), stdout=subprocess.DEVNULL, cwd=REPO)
        out, _ = sink.communicate(timeout=30)
        assert src.wait(timeout=30) == 0
        net.stop_process(src)
    finally:
        if sink_host is not None:
            net.stop_process(sink)
        elif sink.poll() is None:
            sink.kill()
            sink.wait()
    return json.loads(out.strip().splitlines()[-1])


UDP_LIMIT_S = 30.0  # the receiver's bound in all; a sender on a busy host takes about a second


def udp_count(net, i: int, j: int, port: int, count: int = 20) -> int:
    """Datagrams j receives of ``count`` sent by i to j's identity address.

    The receiver counts until all ``count`` arrived, or until the sender has exited and no
    datagram followed for a moment: a slow start of the sender cannot shorten its window."""
    recv = net.popen(
        j,
        [sys.executable, "-c", UDP_RECV, net.identity_address(j), str(port), str(count)]
        + [str(UDP_LIMIT_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert recv.stdout.readline().strip() == "ready"
        send = net.popen(
            i, [sys.executable, "-c", UDP_SEND, net.identity_address(j), str(port), str(count)]
        )
        assert send.wait(timeout=UDP_LIMIT_S) == 0
        net.stop_process(send)
        out, _ = recv.communicate("sent\n", timeout=UDP_LIMIT_S)
    finally:
        net.stop_process(recv)
    return int(out.strip())


# -- root tests --------------------------------------------------------------------------------


@pytest.mark.root
def test_identity_addresses_reach_every_peer_over_the_direct_link(net: LabNetwork) -> None:
    for i in range(net.n):
        for j in range(net.n):
            if i == j:
                continue
            before_tx, before_rx = net.tx_bytes(), net.rx_bytes()
            r = transfer(net, i, j, seconds=0.2)
            after_tx, after_rx = net.tx_bytes(), net.rx_bytes()
            assert r["bytes"] > 0
            # The receiver sees the sender's identity address, not a link address.
            assert r["peer"] == net.identity_address(i)
            # The direct link carried it: sender tx and receiver rx both grew by the payload.
            assert after_tx[(i, j)] - before_tx[(i, j)] >= r["bytes"]
            assert after_rx[(i, j)] - before_rx[(i, j)] >= r["bytes"]
            # ... and no other link of the sender did (only ACKs and stray control bytes).
            k = next(k for k in range(net.n) if k not in (i, j))
            assert after_tx[(i, k)] - before_tx[(i, k)] < r["bytes"] // 10


@pytest.mark.root
def test_management_network_reaches_the_root_namespace(net: LabNetwork) -> None:
    data_before = net.tx_bytes()
    for i in range(net.n):
        port = 17100 + i
        addr = f"{net.coordinator_address}:{port}"
        # The sink runs in the root namespace, where the coordinator will.
        r = goodput(net, i, addr, 0.1, sink_host=None)
        assert r["bytes"] > 0
        assert r["peer"] == net.mgmt_address(i)
    # Management traffic never touches the shaped links.
    sent = {k: v - data_before[k] for k, v in net.tx_bytes().items()}
    assert max(sent.values()) < 10_000


@pytest.mark.root
def test_htb_classes_have_the_configured_rates(net: LabNetwork) -> None:
    for lk in net.topology.links:
        classes = shaping.show_classes(net.host_pid(lk.src), net.intf(lk.src, lk.dst))
        assert [(c.classid, c.rate_mbit, c.ceil_mbit) for c in classes] == [
            (shaping.HTB_CLASS, lk.rate_mbit, lk.rate_mbit)
        ]


@pytest.mark.root
def test_acks_skip_the_queue_of_the_link_they_return_on(net: LabNetwork) -> None:
    transfer(net, 0, 1, seconds=0.3)
    # Host 1 sent no data to 0: only the transfer's ACKs (and its handshake) left on 1's link.
    out = shaping.run(net.host_pid(1), ["tc", "-s", "qdisc", "show", "dev", net.intf(1, 0)])
    direct = int(out.split("direct_packets_stat")[1].split()[0])
    leaf = out.split("qdisc pfifo")[1]
    leaf_pkts = int(leaf.split(" pkt")[0].split()[-1])
    assert direct > 50, out  # 0.3 s at the link's rate is hundreds of segments to acknowledge
    assert leaf_pkts < 10, out  # SYN, FIN and the like; not the ACKs


@pytest.mark.root
def test_a_raw_move_says_when_each_receiver_read_its_last_byte(net: LabNetwork) -> None:
    move = raw_move(net, {(0, 1): 200_000, (1, 0): 50_000})
    assert move.nbytes == 250_000
    assert set(move.received_s) == {0, 1}  # host 0 read the 1->0 bytes, host 1 the 0->1 ones
    assert min(move.received_s.values()) > 0
    assert move.seconds == max(move.received_s.values())


def _class_sent_bytes(pid: int, dev: str) -> int:
    out = shaping.run(pid, ["tc", "-s", "class", "show", "dev", dev])
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("Sent "))
    return int(line.split()[1])


@pytest.mark.root
def test_set_link_changes_the_rate_in_place(net: LabNetwork) -> None:
    pid, dev = net.host_pid(0), net.intf(0, 1)
    transfer(net, 0, 1, seconds=0.2)
    sent_before = _class_sent_bytes(pid, dev)
    assert sent_before > 0
    state = net.set_link(0, 1, rate_mbit=33.0)
    assert state.rate_mbit == 33.0 and net.link_state(0, 1).rate_mbit == 33.0
    assert [(c.rate_mbit, c.ceil_mbit) for c in shaping.show_classes(pid, dev)] == [(33.0, 33.0)]
    # A recreated class would start counting from zero again.
    assert _class_sent_bytes(pid, dev) >= sent_before
    # The reverse direction is a different class on the other end and is untouched.
    back = shaping.show_classes(net.host_pid(1), net.intf(1, 0))
    assert back[0].rate_mbit == net.topology.link(1, 0).rate_mbit


@pytest.mark.root
def test_a_failed_tc_leaves_the_link_as_it_was_and_the_lab_going(net: LabNetwork) -> None:
    pid, dev = net.host_pid(0), net.intf(0, 1)
    before = net.link_state(0, 1)
    # Take the link's shaping away behind the lab's back: changing its rate must now fail.
    subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "tc", "qdisc", "del", "dev", dev, "root"],
        check=True,
        timeout=10,
    )
    with pytest.raises(LabError, match=r"link 0->1: tc failed, the link keeps its previous"):
        net.set_link(0, 1, rate_mbit=before.rate_mbit / 2)
    assert net.link_state(0, 1) == before
    # Other links still change.
    assert net.set_link(0, 2, rate_mbit=21.0).rate_mbit == 21.0


@pytest.mark.root
def test_cut_drops_one_direction_only_and_restore_heals_it(net: LabNetwork) -> None:
    assert udp_count(net, 0, 1, 17200) == 20
    net.set_link(0, 1, up=False)
    assert net.link_state(0, 1).up is False
    rules = cleanup.LabState.load(net.state.path).ns_rules
    assert {"host": 1, "argv": shaping.cut_rule(net.intf(1, 0))} in rules
    assert udp_count(net, 0, 1, 17201) == 0
    assert udp_count(net, 1, 0, 17202) == 20
    net.set_link(0, 1, up=True)
    assert udp_count(net, 0, 1, 17203) == 20
    assert cleanup.LabState.load(net.state.path).ns_rules == []


@pytest.mark.root
def test_loss_fallback_drops_some_and_delay_without_netem_is_refused(tmp_path: Path) -> None:
    cap = capabilities(frozenset({Impairment.LOSS}))
    if cap.netem or not cap.iptables_statistic:
        pytest.skip("this machine has netem (no fallback used) or no statistic match")
    with LabNetwork(
        load_topology(SMALL),
        tag="l" + secrets.token_hex(2),
        state_dir=tmp_path / "state",
        capabilities=cap,
        mgmt_subnet=TEST_MGMT,
    ) as lab:
        lab.set_link(0, 1, loss_pct=50)
        assert {"host": 1, "argv": shaping.loss_rule(lab.intf(1, 0), 50)} in cleanup.LabState.load(
            lab.state.path
        ).ns_rules
        # 40 datagrams at 50% loss: all or none arrive with probability 2 * 0.5**40.
        assert 0 < udp_count(lab, 0, 1, 17300, count=40) < 40
        assert udp_count(lab, 1, 0, 17301, count=40) == 40
        lab.set_link(0, 1, loss_pct=0)
        assert udp_count(lab, 0, 1, 17302, count=40) == 40
        with pytest.raises(LabError, match="delay cannot be emulated"):
            lab.set_link(0, 1, delay_ms=10)
        assert lab.link_state(0, 1).delay_ms == 0


@pytest.mark.root
def test_tx_bytes_rise_on_the_link_that_carried_a_transfer(net, tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    try:
        before = net.tx_bytes()
        assert set(before) == {(i, j) for i in range(3) for j in range(3) if i != j}
        with LinkMonitor(net, db, interval=0.2):
            r = transfer(net, 2, 0, seconds=0.6)
            # Until the monitor has sampled the transfer's last bytes on 2->0.
            deadline = time.monotonic() + SAMPLE_WAIT_S
            for _ in range(int(SAMPLE_WAIT_S / 0.05) + 1):
                got = db.query("SELECT MAX(tx_bytes) AS b FROM link_samples WHERE src=2 AND dst=0")
                if got[0]["b"] is not None and got[0]["b"] - before[(2, 0)] >= r["bytes"]:
                    break
                assert time.monotonic() < deadline, "the monitor never sampled the transfer"
                time.sleep(0.05)
        after = net.tx_bytes()
        assert after[(2, 0)] - before[(2, 0)] >= r["bytes"] > 100_000
        rows = db.query("SELECT src, dst, tx_bytes, mbit FROM link_samples ORDER BY t")
        assert {(row["src"], row["dst"]) for row in rows} == set(before)
        busy = [row["mbit"] for row in rows if (row["src"], row["dst"]) == (2, 0)]
        idle = [row["mbit"] for row in rows if (row["src"], row["dst"]) == (1, 2)]
        # The busy link shows a rate near its configured 30 Mbit/s, the idle one nothing.
        assert max(busy) > 10 and max(idle) < 1
    finally:
        db.close()


@pytest.mark.root
def test_teardown_leaves_no_interfaces_processes_or_state(tmp_path: Path) -> None:
    links_before = cleanup.root_link_names()
    state_dir = tmp_path / "state"
    lab = _lab(state_dir)
    with lab:
        sleeper = lab.popen(1, ["sleep", "60"])
        state = cleanup.LabState.load(lab.state.path)
        recorded = list(state.procs)
        assert sleeper.pid in {p.pid for p in recorded}
        assert len([p for p in recorded if p.kind == "shell"]) == 3
        during = cleanup.root_link_names()
        assert set(state.root_links) | set(state.bridges) <= during
        assert len(during - links_before) == 4  # bridge + one mgmt veth per host
    assert not any(cleanup.is_same_process(p.pid, p.start_time) for p in recorded)
    assert sleeper.poll() is not None
    assert cleanup.root_link_names() == links_before
    assert list(state_dir.glob("*.json")) == []


@pytest.mark.root
def test_teardown_runs_on_exceptions(tmp_path: Path) -> None:
    links_before = cleanup.root_link_names()
    with pytest.raises(RuntimeError, match="boom"), _lab(tmp_path / "state") as lab:
        pids = [lab.host_pid(i) for i in range(lab.n)]
        raise RuntimeError("boom")
    assert cleanup.root_link_names() == links_before
    assert all(cleanup.proc_start_time(p) is None for p in pids)


CRASHING_LAB = textwrap.dedent("""
    import subprocess, sys
    from lab.net.mesh import LabNetwork
    from lab.spec.topology import load_topology
    net = LabNetwork(load_topology(sys.argv[1]), tag=sys.argv[2], state_dir=sys.argv[3],
                     mgmt_subnet=sys.argv[4])
    net.start()
    # A child that ignores the SIGTERM its lab's death sends it (lab.net.lifeline), as one stuck
    # in its teardown would: the next lab's clean-up must end it.
    ignore = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('armed', flush=True); time.sleep(120)"
    )
    stuck = net.popen(0, [sys.executable, "-c", ignore], stdout=subprocess.PIPE, text=True)
    assert stuck.stdout.readline().strip() == "armed"  # it ignores SIGTERM from here on
    print("ready", flush=True)
    sys.stdin.read()  # until killed
""")


@pytest.mark.root
def test_cleanup_leftovers_removes_what_a_killed_lab_left(tmp_path: Path) -> None:
    links_before = cleanup.root_link_names()
    state_dir = tmp_path / "state"
    tag = "k" + secrets.token_hex(2)
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_LAB, str(SMALL), tag, str(state_dir), TEST_MGMT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        state = cleanup.LabState.load(state_dir / f"{tag}.json")
        assert not state.owner_alive()
        procs = [p for p in state.procs if p.kind == "proc"]
        assert len(procs) == 1 and cleanup.is_same_process(procs[0].pid, procs[0].start_time)
        # The bridge outlives its owner: this is what the cleanup is for.
        assert state.bridges[0] in cleanup.root_link_names()
        report = cleanup.cleanup_leftovers(state_dir)
        assert report.cleaned == [tag] and not report.errors
        assert procs[0].pid in report.killed
        assert not any(cleanup.is_same_process(p.pid, p.start_time) for p in state.procs)
        assert cleanup.root_link_names() == links_before
        assert not (state_dir / f"{tag}.json").exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        cleanup.cleanup_leftovers(state_dir)


@pytest.mark.root
def test_cleanup_leaves_live_labs_alone(net: LabNetwork) -> None:
    report = cleanup.cleanup_leftovers(net.state_dir)
    assert report.skipped == [net.tag] and report.cleaned == []
    assert net.state.path.exists()


# -- pure helpers (no root needed) ----------------------------------------------------------


def test_proc_start_time_tells_a_reused_pid_apart() -> None:
    me = cleanup.ProcRecord.of(os.getpid(), "owner")
    assert cleanup.is_same_process(me.pid, me.start_time)
    assert not cleanup.is_same_process(me.pid, me.start_time + 1)


def test_state_file_round_trips_and_refuses_foreign_interface_names(tmp_path: Path) -> None:
    st = cleanup.LabState(tmp_path / "x.json", "x")
    st.add_root_link("crwxm0")
    st.add_bridge("crwxbr")
    st.add_ns_rule(1, ["INPUT", "-j", "DROP"])
    loaded = cleanup.LabState.load(st.path)
    assert (loaded.root_links, loaded.bridges, loaded.ns_rules, loaded.owner) == (
        ["crwxm0"],
        ["crwxbr"],
        [{"host": 1, "argv": ["INPUT", "-j", "DROP"]}],
        st.owner,
    )
    data = json.loads(st.path.read_text())
    data["root_links"].append("eth0")
    st.path.write_text(json.dumps(data))
    with pytest.raises(cleanup.StateError, match="eth0"):
        cleanup.LabState.load(st.path)


def test_cleanup_reports_unreadable_state_and_skips_it(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    report = cleanup.cleanup_leftovers(tmp_path)
    assert isinstance(report, cleanup.CleanupReport)
    assert report.cleaned == [] and len(report.errors) == 1
    assert (tmp_path / "bad.json").exists()


def test_shaping_sizes_grow_with_rate_and_delay() -> None:
    assert shaping.queue_limit(10) == shaping.QUEUE_MIN_PKTS
    assert shaping.queue_limit(1000) > shaping.queue_limit(100) > shaping.QUEUE_MIN_PKTS
    assert shaping.queue_limit(100, delay_ms=100) > shaping.queue_limit(100)
    assert shaping.burst_bytes(1) == shaping.BURST_MIN_BYTES
    assert shaping.burst_bytes(1000) == 125_000
    assert shaping.rate_arg(37.5) == "37500kbit"


def test_leaf_is_netem_only_when_needed_and_available() -> None:
    plain, lossy = shaping.Shape(50), shaping.Shape(50, delay_ms=20, jitter_ms=5, loss_pct=1)
    assert shaping.leaf_kind(plain, netem=True) == "pfifo"
    assert shaping.leaf_kind(lossy, netem=False) == "pfifo"
    args = shaping._leaf_args(lossy, netem=True)
    assert args[:2] == ["netem", "limit"]
    assert args[3:] == ["delay", "20ms", "5ms", "distribution", "normal", "loss", "1%"]
    with pytest.raises(ValueError, match="loss_pct"):
        shaping.Shape(50, loss_pct=101)


def test_schedule_never_puts_a_host_in_two_transfers_at_once() -> None:
    links = [LinkSpec(i, j, 10.0) for i in range(6) for j in range(6) if i != j]
    batches = schedule(links, parallel=3)
    assert sorted((lk.src, lk.dst) for b in batches for lk in b) == sorted(
        (lk.src, lk.dst) for lk in links
    )
    for b in batches:
        hosts = [h for lk in b for h in (lk.src, lk.dst)]
        assert len(b) <= 3 and len(hosts) == len(set(hosts))


def _cap(netem: bool, allow: frozenset[Impairment] = frozenset()) -> Capabilities:
    return Capabilities(True, {"tc": "/usr/sbin/tc"}, True, netem, True, allow)


def test_loss_falls_back_to_iptables_only_when_allowed() -> None:
    assert _cap(True).mode(Impairment.LOSS) is ImpairmentMode.NETEM
    assert _cap(False).mode(Impairment.LOSS) is ImpairmentMode.OFF
    allowed = _cap(False, frozenset({Impairment.LOSS, Impairment.DELAY}))
    assert allowed.mode(Impairment.LOSS) is ImpairmentMode.IPTABLES
    assert allowed.mode(Impairment.DELAY) is ImpairmentMode.OFF


def test_describe_names_each_requested_impairment() -> None:
    topo = load_topology(REPO / "topologies" / "aws-8-regions.yaml")
    text = describe(_cap(False, frozenset({Impairment.DELAY})), topo)
    assert "delay: requested on 56 link(s), NOT EMULATED" in text
    assert "loss: not requested" in text
    assert "delay: active on 56 link(s) via netem" in describe(_cap(True), topo)


class _FakeCounters:
    def __init__(self) -> None:
        self.calls = 0

    def tx_bytes(self) -> dict[tuple[int, int], int]:
        self.calls += 1
        return {(0, 1): 1_000_000 * self.calls, (1, 0): 0}


def test_monitor_writes_rates_from_counter_deltas(tmp_path: Path) -> None:
    db = RunDB(tmp_path / "lab.db")
    try:
        mon = LinkMonitor(_FakeCounters(), db)
        prev, t = mon.sample_once(None, None)
        mon.sample_once(prev, t - 1.0)  # pretend a second passed
        rows = db.query("SELECT src, dst, tx_bytes, mbit FROM link_samples ORDER BY rowid")
        assert [(r["src"], r["dst"], r["tx_bytes"]) for r in rows] == [
            (0, 1, 1_000_000),
            (1, 0, 0),
            (0, 1, 2_000_000),
            (1, 0, 0),
        ]
        assert rows[0]["mbit"] == 0.0
        assert rows[2]["mbit"] == pytest.approx(8.0, rel=0.01)
    finally:
        db.close()
