"""crew.Averager's port and compression options on loopback (no root, no lab): the data plane
listens where ``data_port=`` / ``CREW_DATA_PORT`` say, the coordinator where
``CREW_CONTROL_PORT`` says, bad values are named, and ``compress=`` reaches the wire."""

from __future__ import annotations

import errno
import random
import socket
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

import crew
from crew.runtime import rundb
from crew.runtime.launch import PortRange, control_port, data_port_range, parse_port_range
from crew.wire.transport import listen_on

try:
    from test_averager import ARGS, env_for, free_port, run_ranks
except ImportError:  # tests/ became a package
    from tests.test_averager import ARGS, env_for, free_port, run_ranks


def free_run(count: int) -> int:
    """The first of ``count`` consecutive ports that are free on loopback now (below Linux's
    ephemeral range, so the kernel's own choices rarely land there)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        try:
            with ExitStack() as stack:
                for port in range(base, base + count):
                    s = stack.enter_context(socket.socket())
                    s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {count} consecutive free ports")


def held(port: int) -> socket.socket:
    """A listener on ``port`` for all addresses, as another program's would be."""
    s = socket.create_server(("0.0.0.0", port))
    return s


# -- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "first", "last"),
    [
        (0, 0, 0),
        (29600, 29600, 29600),
        ("29600", 29600, 29600),
        (" 29600-29607 ", 29600, 29607),
        ("29600 - 29601", 29600, 29601),
        ("65535", 65535, 65535),
    ],
)
def test_port_settings_parse(value, first, last):
    ports = parse_port_range(value, "CREW_DATA_PORT")
    assert (ports.first, ports.last) == (first, last)
    assert list(ports.ports) == list(range(first, last + 1))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("abc", "a port or a range 'A-B'"),
        ("29600-", "a port or a range 'A-B'"),
        ("-5", "a port or a range 'A-B'"),
        ("1-2-3", "a port or a range 'A-B'"),
        ("29607-29600", "1 <= first <= last"),
        ("0-10", "starts at port 1"),
        ("70000", "ports are in 1..65535"),
        (-1, "a port in 1..65535"),
        (65536, "a port in 1..65535"),
        (True, "got bool"),
        (29600.0, "got float"),
    ],
)
def test_bad_port_settings_are_named(value, says):
    with pytest.raises(crew.PortError, match="CREW_DATA_PORT") as err:
        parse_port_range(value, "CREW_DATA_PORT")
    assert says in str(err.value)
    assert isinstance(err.value, crew.LaunchError) and isinstance(err.value, ValueError)


def test_the_argument_wins_over_the_environment():
    env = {"CREW_DATA_PORT": "29600-29603"}
    assert data_port_range(None, env) == PortRange(29600, 29603, "CREW_DATA_PORT")
    assert data_port_range(29700, env) == PortRange(29700, 29700, "data_port")
    assert data_port_range(None, {}) == PortRange(0, 0, "CREW_DATA_PORT")
    assert str(data_port_range(None, {})) == "any free port"
    with pytest.raises(crew.PortError, match="data_port"):
        data_port_range("x", env)


def test_the_control_port_is_one_port():
    assert control_port({}) == 0
    assert control_port({"CREW_CONTROL_PORT": "29502"}) == 29502
    with pytest.raises(crew.PortError, match="CREW_CONTROL_PORT: one port"):
        control_port({"CREW_CONTROL_PORT": "29502-29503"})


# -- binding ------------------------------------------------------------------------------------


def test_a_listener_takes_the_first_free_port_of_a_range():
    base = free_run(3)
    with held(base):
        sock = listen_on("0.0.0.0", range(base, base + 3))
        try:
            assert sock.getsockname()[1] == base + 1
            other = listen_on("0.0.0.0", range(base, base + 3))  # a second rank on this host
            assert other.getsockname()[1] == base + 2
            other.close()
        finally:
            sock.close()


def test_a_range_with_every_port_taken_is_eaddrinuse_naming_the_range():
    base = free_run(2)
    with held(base), held(base + 1):
        with pytest.raises(OSError) as err:
            listen_on("0.0.0.0", range(base, base + 2))
    assert err.value.errno == errno.EADDRINUSE
    assert f"{base}-{base + 1}" in str(err.value)


# -- a job --------------------------------------------------------------------------------------


def test_ranks_on_one_host_share_a_data_port_range_and_the_control_port_is_set():
    """Three ranks, CREW_DATA_PORT=A-(A+3) with A taken by another program: the ranks listen
    on A+1..A+3, one each, and the coordinator on CREW_CONTROL_PORT."""
    base = free_run(5)
    control = base + 4
    port = free_port()
    envs = [
        {
            **env_for(r, 3, port),
            "CREW_DATA_PORT": f"{base}-{base + 3}",
            "CREW_CONTROL_PORT": str(control),
        }
        for r in range(3)
    ]

    def body(rank, averager, tensors):
        return averager.config, averager.step()

    with held(base):
        res = run_ranks(3, body, envs=envs, args=ARGS)
    assert not any(isinstance(r, Exception) for r in res.values()), res
    cfg = res[0][0]
    assert sorted(cfg.data_ports) == [base + 1, base + 2, base + 3]
    assert all(r[0].data_ports == cfg.data_ports for r in res.values())  # one roster for all
    assert cfg.coordinator_port == control
    assert any(r[1].averaged for r in res.values())


def test_a_taken_data_port_is_a_port_error_naming_the_setting():
    base = free_run(1)
    env = {**env_for(1, 2, free_port()), "CREW_DATA_PORT": str(base)}
    with held(base):
        with pytest.raises(crew.PortError, match=f"rank 1: .*CREW_DATA_PORT={base}"):
            crew.Averager([torch.zeros(3)], env=env, timeout=2.0)
    with pytest.raises(crew.PortError, match="data_port: a port or a range"):
        crew.Averager([torch.zeros(3)], env=env, data_port="29600-", timeout=2.0)


def test_a_taken_control_port_fails_rank_0_before_the_rendezvous():
    base = free_run(1)
    env = {**env_for(0, 2, free_port()), "CREW_CONTROL_PORT": str(base)}
    with held(base):
        with pytest.raises(crew.PortError, match=f"CREW_CONTROL_PORT={base}"):
            crew.Averager([torch.zeros(3)], env=env, timeout=2.0)


# -- compression --------------------------------------------------------------------------------


def _group_bytes(run_dir: Path) -> list[int]:
    conn = rundb.connect(run_dir / "run.db", readonly=True)
    try:
        rows = conn.execute(
            "SELECT bytes FROM groups WHERE status = ?", (rundb.GroupStatus.COMPLETED.value,)
        ).fetchall()
    finally:
        conn.close()
    return [int(r["bytes"]) for r in rows]


def test_int8_compression_averages_within_its_bound_and_moves_a_quarter_of_the_bytes(tmp_path):
    values = 4096

    def tensors(rank):
        return [torch.from_numpy(np.random.default_rng(rank).normal(size=values).astype("f4"))]

    def body(rank, averager, ts):
        before = ts[0].clone()
        rnd = averager.step()
        return rnd, before, ts[0].clone(), averager.config.compress

    moved = {}
    for codec in ("none", "int8"):
        run_dir = tmp_path / codec
        args = {**ARGS, "compress": codec, "run_dir": run_dir}
        res = run_ranks(2, body, tensors=tensors, args=args)
        assert not any(isinstance(r, Exception) for r in res.values()), res
        exact = (res[0][1] + res[1][1]) / 2
        for rank in (0, 1):
            rnd, _, after, compress = res[rank]
            assert rnd.averaged and compress == codec
            err = (after - exact).abs().max().item()
            if codec == "none":
                assert err < 1e-6
            else:  # 255 steps per block of 256: a few steps of the values' range at most
                assert 0 < err < 4 * float(exact.max() - exact.min()) / 255
        moved[codec] = sum(_group_bytes(run_dir))
    assert 0 < moved["int8"] < 0.3 * moved["none"], moved


def test_an_unknown_codec_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="compress: one of none, fp16, int8, got 'zip'"):
        crew.Averager([torch.zeros(3)], env={}, compress="zip")
