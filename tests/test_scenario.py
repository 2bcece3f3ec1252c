"""Fault scenarios: validation messages, macro expansion, and playing into a real run DB."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from crew.runtime import rundb
from lab import scenario as scenario_cli
from lab.orchestrate import commands as lc
from lab.orchestrate.commands import LabLimits
from lab.spec import scenario as sc
from lab.spec.scenario import ScenarioError, ScenarioPlayer, TriggerKind, load_scenario
from lab.spec.topology import load_topology

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "scenarios"
BAD = Path(__file__).resolve().parent / "data" / "bad_scenarios"
RATES8 = load_topology(REPO / "topologies" / "default.yaml").bw_matrix()
RATES3 = load_topology(REPO / "topologies" / "small.yaml").bw_matrix()

# file -> a substring the error must contain (loaded for n=8 with default.yaml's rates)
BAD_CASES = {
    "empty.yaml": "(document): file is empty",
    "syntax_error.yaml": "(document): YAML syntax error at line",
    "duplicate_key.yaml": "duplicate key 'name'",
    "top_level_list.yaml": "(document): must be a mapping, got list",
    "missing_name.yaml": "name: required key is missing",
    "bad_name.yaml": "name: str 'link cut' is not a valid name",
    "unknown_top_key.yaml": "step: unknown key 'step'; did you mean 'steps'?",
    "empty_steps.yaml": "steps: must be a non-empty list",
    "step_not_mapping.yaml": "steps[0]: must be a mapping, got str 'kill_worker'",
    "both_triggers.yaml": "steps[0]: give exactly one of `at`",
    "no_trigger.yaml": "steps[1]: give exactly one of `at`",
    "negative_at.yaml": "steps[0].at: -5 is out of range",
    "at_string.yaml": "steps[0].at: must be a number, got str '30s'",
    "after_groups_float.yaml": "steps[0].after_groups: must be an integer",
    "unknown_do.yaml": "steps[0].do: unknown step 'cut_links'; did you mean 'cut_link'?",
    "worker_out_of_range.yaml": "steps[0].args.worker: unknown worker 8",
    "link_dst_out_of_range.yaml": "steps[2].args.dst: unknown worker 9",
    "src_equals_dst.yaml": "steps[0].args.dst: a link needs two workers",
    "missing_arg.yaml": "steps[0].args.factor: missing",
    "unknown_arg.yaml": "steps[0].args.bidirectional: unknown argument for cut_link",
    "delay_without_netem.yaml": "steps[0].args.delay_ms: delay is not available",
    "set_p_too_big.yaml": "steps[0].args.p: must be in 1..8",
    "args_not_mapping.yaml": "steps[0].args: must be a mapping, got list",
    "bool_worker.yaml": "steps[0].args.worker: expected an integer, got True",
    "random_without_seed.yaml": "seed: required: steps[0] uses the random macro",
    "fail_random_links_too_many.yaml": "steps[0].args.k: cannot cut 50 of the 56 directed links",
    "fail_random_links_over_total.yaml": "steps[0].args.k: 57 is more than the 56 directed",
    "until_before_at.yaml": "steps[0].args.until: 30 must be later than at=40",
    "macro_after_groups.yaml": "steps[0].after_groups: chaos spreads over time",
    "chaos_unknown_kind.yaml": "steps[0].args.kinds[1]: unknown chaos fault 'crash'",
    "chaos_every_zero.yaml": "steps[0].args.every: 0 is out of range",
    "chaos_unknown_arg.yaml": "steps[0].args.slow_facter: unknown key",
    "scale_link_fraction_zero.yaml": "steps[0].args.fraction: 0 is out of range",
    "seed_negative.yaml": "seed: -1 is out of range",
}

# shipped file -> smallest n it is valid for (3 means it is also checked for n=3)
SHIPPED = {
    "worker-crash.yaml": 3,
    "worker-crash-and-rejoin.yaml": 3,
    "link-cut-during-scatter.yaml": 3,
    "link-cut-during-broadcast.yaml": 3,
    "bandwidth-drop.yaml": 3,
    "contention.yaml": 3,
    "random-link-failures.yaml": 7,
    "chaos.yaml": 3,
    "overlapping-faults.yaml": 8,
    "rolling-faults.yaml": 8,
    "coordinator-crash.yaml": 2,
}


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -------------------------------------------------------------------------------- validation


def test_every_bad_file_has_a_case() -> None:
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(BAD_CASES)
    assert len(BAD_CASES) >= 15


@pytest.mark.parametrize("filename", sorted(BAD_CASES))
def test_bad_scenario_is_refused_with_reason(filename: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(BAD / filename, 8, rates=RATES8)
    message = str(info.value)
    assert BAD_CASES[filename] in message
    assert message.startswith(str(BAD / filename) + ": ")
    assert info.value.field in message


def test_rate_relative_steps_need_rates() -> None:
    with pytest.raises(ScenarioError, match=r"steps\[0\]\.do: scale_link needs the topology"):
        load_scenario(SCENARIOS / "bandwidth-drop.yaml", 8)
    with pytest.raises(ScenarioError, match=r"args\.kinds: chaos fault 'rate' needs"):
        load_scenario(SCENARIOS / "chaos.yaml", 8)


def test_limits_decide_what_is_allowed(tmp_path: Path) -> None:
    path = BAD / "delay_without_netem.yaml"
    netem = LabLimits(n=8, impairments=frozenset({"rate", "delay"}))
    s = load_scenario(path, 8, limits=netem)
    assert [st.command for st in s.steps] == [lc.SetLink(0, 1, None, 50.0, None)]
    with pytest.raises(ValueError, match="limits are for n=4"):
        load_scenario(path, 8, limits=LabLimits(n=4))


# -------------------------------------------------------------------------- shipped scenarios


@pytest.mark.parametrize("filename", sorted(SHIPPED))
def test_shipped_scenario_loads_for_n8(filename: str) -> None:
    s = load_scenario(SCENARIOS / filename, 8, rates=RATES8)
    assert s.n == 8 and s.steps and s.description
    assert s.name == filename.removesuffix(".yaml")
    for step in s.steps:  # only plain commands survive expansion, each re-parseable
        assert lc.parse_command(step.command.KIND, lc.to_args(step.command), LabLimits(8))
    times = [st.trigger.value for st in s.steps if st.trigger.kind is TriggerKind.AT]
    assert times == sorted(times)


@pytest.mark.parametrize("filename", sorted(f for f, n in SHIPPED.items() if n <= 3))
def test_shipped_scenario_loads_for_n3(filename: str) -> None:
    s = load_scenario(SCENARIOS / filename, 3, rates=RATES3)
    assert all(max(_workers(st.command), default=0) < 3 for st in s.steps)


def test_shipped_scenarios_are_all_listed() -> None:
    assert sorted(p.name for p in SCENARIOS.glob("*.yaml")) == sorted(SHIPPED)


def test_random_link_failures_refused_below_its_minimum_n() -> None:
    with pytest.raises(ScenarioError, match=r"steps\[0\]\.args\.k"):
        load_scenario(SCENARIOS / "random-link-failures.yaml", 6)


def test_link_cut_scenarios_cut_one_direction_of_the_same_pair() -> None:
    scatter = load_scenario(SCENARIOS / "link-cut-during-scatter.yaml", 8)
    broadcast = load_scenario(SCENARIOS / "link-cut-during-broadcast.yaml", 8)
    cut_s = [st.command for st in scatter.steps if isinstance(st.command, lc.CutLink)]
    cut_b = [st.command for st in broadcast.steps if isinstance(st.command, lc.CutLink)]
    assert cut_s == [lc.CutLink(0, 2, False)] and cut_b == [lc.CutLink(2, 0, False)]
    assert "SCATTER" in scatter.description and "BROADCAST" in broadcast.description


def test_bandwidth_drop_is_ten_percent_of_the_configured_rate() -> None:
    s = load_scenario(SCENARIOS / "bandwidth-drop.yaml", 8, rates=RATES8)
    drop, restore = (st.command for st in s.steps)
    assert isinstance(drop, lc.SetLink) and isinstance(restore, lc.SetLink)
    assert drop.rate_mbit == pytest.approx(0.1 * RATES8[1, 2])
    assert restore.rate_mbit == pytest.approx(RATES8[1, 2])


def _workers(c: lc.Command) -> list[int]:
    return [v for k, v in lc.to_args(c).items() if k in ("worker", "src", "dst")]


# ---------------------------------------------------------------------------- macro expansion


def random_links(tmp_path: Path, seed: int, k: int = 20, n: int = 8) -> sc.Scenario:
    path = write(
        tmp_path,
        f"""
        name: rl
        seed: {seed}
        steps:
          - {{at: 40, do: fail_random_links, args: {{k: {k}, until: 110}}}}
        """,
        name=f"rl{seed}.yaml",
    )
    return load_scenario(path, n)


def test_fail_random_links_yields_exactly_k_distinct_permanent_cuts(tmp_path: Path) -> None:
    s = random_links(tmp_path, seed=7)
    cmds_ = [st.command for st in s.steps]
    assert len(cmds_) == 20
    assert all(isinstance(c, lc.CutLink) and not c.both for c in cmds_)
    links = {(c.src, c.dst) for c in cmds_}  # type: ignore[union-attr]
    assert len(links) == 20
    times = [st.trigger.value for st in s.steps]
    assert times == sorted(times) and 40 <= times[0] and times[-1] <= 110
    assert {st.origin for st in s.steps} == {"steps[0] (fail_random_links)"}
    # After all the cuts, every ordered pair still has a direct link or a one-relay path.
    up = np.ones((8, 8), dtype=bool)
    np.fill_diagonal(up, False)
    for i, j in links:
        up[i, j] = False
    for i in range(8):
        for j in range(8):
            if i != j:
                assert up[i, j] or any(up[i, r] and up[r, j] for r in range(8))


def test_macro_expansion_is_deterministic_per_seed(tmp_path: Path) -> None:
    a, b = random_links(tmp_path, 7), random_links(tmp_path, 7)
    assert a.steps == b.steps
    assert random_links(tmp_path, 8).steps != a.steps
    c1 = load_scenario(SCENARIOS / "chaos.yaml", 8, rates=RATES8)
    c2 = load_scenario(SCENARIOS / "chaos.yaml", 8, rates=RATES8)
    assert c1.steps == c2.steps and c1.timeline() == c2.timeline()


def test_chaos_undoes_every_fault_and_never_conflicts(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: long-chaos
        seed: 3
        steps:
          - {at: 0, do: chaos, args: {until: 600, every: 3}}
        """,
    )
    s = load_scenario(path, 8, rates=RATES8)
    kinds = {type(st.command) for st in s.steps}
    assert kinds == {
        lc.KillWorker, lc.RestartWorker, lc.SlowWorker, lc.CutLink, lc.RestoreLink,
        lc.SetLink, lc.StartContention, lc.StopContention,
    }  # fmt: skip
    dead: set[int] = set()
    slow: dict[int, float] = {}
    cut: set[tuple[int, int]] = set()
    flows: set[tuple[int, int]] = set()
    rates: dict[tuple[int, int], float] = {}
    for st in s.steps:  # replay: every command must make sense in the state it meets
        assert 0 <= st.trigger.value <= 600
        match st.command:
            case lc.KillWorker(worker=w):
                assert w not in dead and not dead  # max_dead = 1
                dead.add(w)
            case lc.RestartWorker(worker=w):
                dead.remove(w)
            case lc.SlowWorker(worker=w, factor=f):
                assert (f == 1.0) == (w in slow)
                slow.pop(w) if f == 1.0 else slow.__setitem__(w, f)
            case lc.CutLink(src=a, dst=b):
                assert (a, b) not in cut | flows | set(rates)
                cut.add((a, b))
            case lc.RestoreLink(src=a, dst=b):
                cut.remove((a, b))
            case lc.SetLink(src=a, dst=b, rate_mbit=r):
                if (a, b) in rates:
                    assert r == pytest.approx(RATES8[a, b])
                    del rates[(a, b)]
                else:
                    assert (a, b) not in cut | flows
                    assert r == pytest.approx(0.1 * RATES8[a, b])
                    rates[(a, b)] = r
            case lc.StartContention(src=a, dst=b):
                assert (a, b) not in cut | flows | set(rates)
                flows.add((a, b))
            case lc.StopContention(src=a, dst=b):
                flows.remove((a, b))
    assert not dead and not slow and not cut and not flows and not rates


def test_steps_are_sorted_with_ties_in_file_order(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        name: order
        steps:
          - {after_groups: 5, do: set_p, args: {p: 2}}
          - {at: 50, do: restore_link, args: {src: 0, dst: 1}}
          - {at: 20, do: cut_link, args: {src: 0, dst: 1}}
          - {at: 50, do: cut_link, args: {src: 1, dst: 0}}
          - {after_groups: 1, do: set_scheme, args: {scheme: preduce}}
        """,
    )
    s = load_scenario(path, 3)
    assert [st.command for st in s.steps] == [
        lc.CutLink(0, 1),
        lc.RestoreLink(0, 1),
        lc.CutLink(1, 0),
        lc.SetScheme("preduce"),
        lc.SetP(2),
    ]
    assert [st.origin for st in s.steps] == [f"steps[{i}]" for i in (2, 1, 3, 4, 0)]


# ------------------------------------------------------------------------------------ player


@pytest.fixture
def run_db(tmp_path: Path) -> Path:
    db = tmp_path / "run" / "lab.db"
    conn = rundb.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO workers (id, name, cloud, address) VALUES (?,?,?,?)",
            [(i, f"w{i}", f"c{i}", f"10.0.0.{i + 1}") for i in range(3)],
        )
    conn.close()
    return db


def commands_rows(db: Path) -> list[tuple[int, float, str, dict, str]]:
    conn = rundb.connect(db, readonly=True)
    try:
        return [
            (r["id"], r["t"], r["kind"], json.loads(r["args"]), r["status"])
            for r in conn.execute("SELECT * FROM commands ORDER BY id")
        ]
    finally:
        conn.close()


def test_player_submits_each_step_once_when_due(tmp_path: Path, run_db: Path) -> None:
    path = write(
        tmp_path,
        """
        name: play
        steps:
          - {at: 10, do: kill_worker, args: {worker: 1}}
          - {at: 25, do: restart_worker, args: {worker: 1}}
          - {after_groups: 3, do: cut_link, args: {src: 0, dst: 2}}
          - {at: 10, do: slow_worker, args: {worker: 2, factor: 3}}
        """,
    )
    s = load_scenario(path, 3)
    start = 1_000.0
    player = ScenarioPlayer(s, run_db, start_time=start)
    assert player.poll(start + 0.0, 0) == []
    assert player.poll(start + 9.9, 2) == []
    first = player.poll(start + 10.0, 2)
    assert len(first) == 2
    assert player.poll(start + 12.0, 2) == []  # not re-submitted
    third = player.poll(start + 12.5, 3)
    assert len(third) == 1 and not player.done
    last = player.poll(start + 30.0, 3)
    assert len(last) == 1 and player.done
    assert player.poll(start + 99.0, 99) == []
    rows = commands_rows(run_db)
    assert [r[0] for r in rows] == first + third + last
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        (start + 10.0, "kill_worker", {"worker": 1}, "pending"),
        (start + 10.0, "slow_worker", {"worker": 2, "factor": 3.0}, "pending"),
        (start + 12.5, "cut_link", {"src": 0, "dst": 2, "both": False}, "pending"),
        (start + 30.0, "restart_worker", {"worker": 1}, "pending"),
    ]
    # What the lab's applier will read back parses to the very commands of the scenario.
    conn = rundb.connect(run_db, readonly=True)
    try:
        limits = lc.load_limits(conn)
        parsed = [
            lc.parse_row(r, limits) for r in conn.execute("SELECT * FROM commands ORDER BY id")
        ]
    finally:
        conn.close()
    assert parsed == [st.command for st, _ in player.submitted]


def test_player_catches_up_after_a_late_poll(tmp_path: Path, run_db: Path) -> None:
    s = load_scenario(SCENARIOS / "link-cut-during-scatter.yaml", 3)
    player = ScenarioPlayer(s, run_db, start_time=0.0)
    ids = player.poll(200.0, 0)
    assert len(ids) == 4 and player.done
    assert [r[2] for r in commands_rows(run_db)] == [
        "slow_worker", "cut_link", "restore_link", "slow_worker",
    ]  # fmt: skip


def test_player_refuses_a_scenario_for_another_run(tmp_path: Path, run_db: Path) -> None:
    s8 = load_scenario(SCENARIOS / "worker-crash.yaml", 8)
    with pytest.raises(ScenarioError, match="loaded for n=8, but this run has 3 workers"):
        ScenarioPlayer(s8, run_db, start_time=0.0)
    netem = LabLimits(n=3, impairments=frozenset({"rate", "delay"}))
    delayed = sc.parse_scenario(
        {
            "name": "d",
            "steps": [{"at": 1, "do": "set_link", "args": {"src": 0, "dst": 1, "delay_ms": 5}}],
        },
        3,
        limits=netem,
    )
    with pytest.raises(ScenarioError, match=r"steps\[0\]\.args\.delay_ms: delay is not available"):
        ScenarioPlayer(delayed, run_db, start_time=0.0)
    with pytest.raises(FileNotFoundError):
        ScenarioPlayer(delayed, tmp_path / "nope.db", start_time=0.0)
    assert commands_rows(run_db) == []


# ---------------------------------------------------------------------------------------- CLI


def test_cli_prints_timeline_and_fails_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert scenario_cli.main([str(SCENARIOS / "chaos.yaml"), "--n", "8"]) == 0
    out = capsys.readouterr().out
    assert "scenario 'chaos' for n=8" in out and "restart worker" in out
    assert scenario_cli.main([str(BAD / "worker_out_of_range.yaml"), "--n", "8"]) == 2
    err = capsys.readouterr().err
    assert "steps[0].args.worker: unknown worker 8" in err
    assert scenario_cli.main([str(SCENARIOS / "worker-crash.yaml"), "--n", "3"]) == 0
    assert scenario_cli.main([str(SCENARIOS / "bandwidth-drop.yaml"), "--n", "3"]) == 2
    assert "needs the topology's link rates" in capsys.readouterr().err
    small = str(REPO / "topologies" / "small.yaml")
    assert scenario_cli.main([str(SCENARIOS / "bandwidth-drop.yaml"), "--topology", small]) == 0
