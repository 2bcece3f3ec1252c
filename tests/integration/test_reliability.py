"""The reliability suite: what a real lab survives, scenario by scenario.

Each shipped scenario (``scenarios/*.yaml``) is played on a small lab, as ``lab.run
--scenario`` would play it: the same expanded steps through ``ScenarioPlayer`` into the
``commands`` table and the lab's fault injector. Only the clock differs. The shipped
timelines assume a lab that needs 20-30 s to come up and run for minutes; here the player's
clock starts once the lab has completed its first groups, and every ``at`` is multiplied by
``Case.scale`` (``Scenario.scaled``). Where the file's gaps only give the lab time to react
(``Case.hurry``), each step comes as soon as the lab has answered the ones before it, at the
latest when that clock says. Order, targets and ties are those of the file.

For every scenario, whatever it injected:

* every command was applied (none rejected), and after each one at least one group that
  formed after it completed: the lab keeps training through every fault and every undo;
* every completed group averaged exactly (``verify_err`` < 1e-3, see ``crew.control.verify``);
* no group is left open once the lab has stopped, and ``lab.audit`` passes on the finished
  run (no lost update, no overlapping or hung group, consistent records);
* nothing of the lab (interface, process, state file) is left on the machine;

plus a check that the scenario hit what it aims at (a failover for a cut, the rejoin of a
restarted worker, ...). Observed recovery times are printed (run with ``-s`` to see them);
they are figures, never assertions.

Two more tests cover the lab's own processes: the lab SIGKILLed mid-run and cleaned up by the
next one, and the coordinator, the lab's single point of failure, killed mid-run.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from labkit import (
    POLL_S,
    assert_nothing_left,
    completed_groups,
    lab_pids,
    rows,
    small_opts,
    wait_until,
)

from lab import audit as lab_audit
from lab.net.cleanup import (
    DEFAULT_STATE_DIR,
    ROOT_NAME_PREFIX,
    CleanupReport,
    LabState,
    StateError,
    is_same_process,
    remove_recorded,
    root_link_names,
)
from lab.net.preflight import check
from lab.orchestrate import commands as cmds
from lab.orchestrate.runner import REPO, LabRun, lab_limits
from lab.report.pace import WINDOW_S, Pace, read_pace
from lab.spec.scenario import Scenario, ScenarioPlayer, load_scenario
from lab.spec.topology import load_topology

CHILDREN_GONE_S = 30.0  # workers save a checkpoint on SIGTERM
pytestmark = [pytest.mark.root, pytest.mark.slow]

FOUR = REPO / "tests" / "data" / "topologies" / "four.yaml"
SMALL = REPO / "topologies" / "small.yaml"
DEFAULT = REPO / "topologies" / "default.yaml"
SCENARIOS = REPO / "scenarios"

WARM_GROUPS = 2  # the scenario clock starts once this many groups have completed
WARM_WAIT_S = 240.0  # torch imports on 2 shared cores; eight workers take the longest
SETTLE_WAIT_S = 150.0  # after the last step: time for every fault to be followed by a group
EXACT = 1e-3  # verify_err below this: the group's average was right
RETRY_LINK_S = 20.0  # a cut link is out of plans at least this long after its failure
# Issue 16 asks for no 10 s window below 20% of the pre-fault pace. The full-length runs
# (lab.run, 150 s; README "Pace under overlapping faults") measure 21-25% for overlapping-faults
# since a suspect is set aside once (8% before, 0% before probes) and 33-39% for rolling-faults,
# with a thin margin: the worst window holds 7-8 groups. Here the timeline is compressed x4 on a
# smaller lab, so the faults overlap more than in the file.
# Asserted: training never nearly stops (10%) ...
PACE_MIN_SHARE = 0.1
PACE_BACK_S = 15.0  # ... and back to 80% within 15 s of the last repair
PACED = ("overlapping-faults", "rolling-faults")  # scenarios whose pace is asserted
COORDINATOR_BACK_S = 5.0  # a killed coordinator: groups complete again within this
# A hurried scenario's next step waits for this many completed groups formed after each step
# before it (CUT_ANSWER_GROUPS after a cut, all planned around the dead link) ...
ANSWER_GROUPS = 3
CUT_ANSWER_GROUPS = 4
KILL_NOTICE_S = 1.0  # ... counted after a kill from this long after it (the check's window)
STOP_WAIT_S = 60.0


def _members(g: sqlite3.Row) -> list[int]:
    return json.loads(g["members"])


def _edges(g: sqlite3.Row) -> set[tuple[int, int]]:
    plan = json.loads(g["plan"])
    return {(int(a), int(b)) for r in plan["routes"] for a, b in r[3] + r[4]}


def _gone(pid: int, start_time: int | None = None) -> bool:
    """The process ended (a zombie counts: it runs nothing and holds nothing)."""
    if start_time is not None:
        return not is_same_process(pid, start_time)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _tag_links(tag: str) -> list[str]:
    return sorted(n for n in root_link_names() if n.startswith(ROOT_NAME_PREFIX + tag))


# -- the scenarios -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """A shipped scenario, the lab it runs on here, and how much its clock is compressed.

    ``hurry``: the file's gaps only give the lab time to react to each step, so each next step
    is played as soon as the lab has answered the ones before (``_answered``), at the latest
    when the compressed clock says. Scenarios whose faults are meant to overlap keep their
    clock."""

    file: str
    topology: Path
    scale: float
    p: int = 2
    hurry: bool = False


CASES = [
    # p = 3: the group the kill cuts keeps two survivors to average.
    Case("worker-crash", FOUR, 0.25, p=3, hurry=True),
    Case("worker-crash-and-rejoin", FOUR, 0.25, hurry=True),
    Case("link-cut-during-scatter", SMALL, 0.25, hurry=True),
    Case("link-cut-during-broadcast", SMALL, 0.25, hurry=True),
    Case("bandwidth-drop", SMALL, 0.25, hurry=True),
    Case("contention", SMALL, 0.25, hurry=True),
    Case("random-link-failures", DEFAULT, 0.25, p=3),  # needs n >= 7
    Case("chaos", SMALL, 0.25),
    Case("overlapping-faults", DEFAULT, 0.25, p=3),  # needs n >= 8
    # Its first fault is at 30 s: x0.25 left less than one 10 s window before it for the
    # pre-fault pace (measured: no baseline); x0.4 leaves 12 s.
    Case("rolling-faults", DEFAULT, 0.4, p=3),  # needs n >= 8
    Case("coordinator-crash", SMALL, 0.25, hurry=True),
]


def test_every_shipped_scenario_has_a_case() -> None:
    assert sorted(c.file for c in CASES) == sorted(p.stem for p in SCENARIOS.glob("*.yaml"))


def _applied(db: Path) -> list[sqlite3.Row]:
    return rows(db, "SELECT * FROM commands WHERE status='applied' ORDER BY id")


def _unanswered(db: Path) -> list[sqlite3.Row]:
    """Applied commands with no completed group formed after them yet."""
    newest = rows(db, "SELECT MAX(formed_at) AS t FROM groups WHERE status='completed'")[0]["t"]
    return [c for c in _applied(db) if newest is None or newest < c["applied_at"]]


def _failovers(db: Path, s: int, d: int, since: float = 0.0) -> list[sqlite3.Row]:
    """The coordinator's failovers of a group over the link s->d (a one-way cut may be reported
    by either direction: TCP's ACKs), oldest first; ``data`` names the group."""
    return rows(
        db,
        "SELECT t, data FROM events WHERE kind='recovery' AND t >= ?"
        " AND (message LIKE ? OR message LIKE ?) ORDER BY id",
        (since, f"%link {s}->{d} failed during%", f"%link {d}->{s} failed during%"),
    )


def _answered(db: Path, n: int) -> bool:
    """Whether the lab has answered every step played so far, so the next may come now.

    Every worker has taken part in a completed group (so each is registered, and one killed
    had committed a model); nothing is pending; at least ANSWER_GROUPS groups formed after each
    applied command completed (after a kill, from KILL_NOTICE_S on, by when the coordinator
    knows); a killed worker is recorded dead (until it is restarted); and a cut link has
    failed a group over, which then ended, with CUT_ANSWER_GROUPS groups after the cut."""
    done = completed_groups(db)
    if len({w for g in done for w in _members(g)}) < n:
        return False
    if rows(db, "SELECT id FROM commands WHERE status='pending'"):
        return False
    applied = _applied(db)
    for k, c in enumerate(applied):
        args = json.loads(c["args"])
        since = c["applied_at"] + (KILL_NOTICE_S if c["kind"] == "kill_worker" else 0.0)
        want = CUT_ANSWER_GROUPS if c["kind"] == "cut_link" else ANSWER_GROUPS
        if sum(g["formed_at"] >= since for g in done) < want:
            return False
        restarted = any(
            r["kind"] == "restart_worker" and json.loads(r["args"]) == args for r in applied[k:]
        )
        if c["kind"] == "kill_worker" and not restarted:
            state = rows(db, "SELECT state FROM worker_status WHERE worker=?", (args["worker"],))
            if not state or state[0]["state"] != "dead":
                return False
        if c["kind"] == "cut_link":
            moved = _failovers(db, args["src"], args["dst"], c["applied_at"])
            if not moved:
                return False
            group = json.loads(moved[0]["data"])["group"]
            if rows(db, "SELECT status FROM groups WHERE id=?", (group,))[0]["status"] == "open":
                return False
    return True


def _hurry(lab: LabRun, sc: Scenario, mid_reduce: dict[int, int]) -> None:
    """Play the next step now, once the lab has answered every step before it
    (``Case.hurry``); a worker is killed only while it is a member of an open group (noted in
    ``mid_reduce``: worker -> that group)."""
    player = lab.player
    assert player is not None
    if player.done or not _answered(lab.db_path, lab.topo.n):
        return
    step = sc.steps[len(player.submitted)]  # steps fire in order
    if isinstance(step.command, cmds.KillWorker):
        w = step.command.worker
        mid = [
            g["id"]
            for g in rows(lab.db_path, "SELECT id, members FROM groups WHERE status='open'")
            if w in _members(g)
        ]
        if not mid:
            return
        mid_reduce[w] = mid[-1]
    player.start_time = min(player.start_time, time.time() - step.trigger.value)
    lab.poll()  # submits the step and applies it at once: the group is still open


def _fault_target(kind: str, args: dict) -> tuple[str, object] | None:
    if kind == "kill_worker":
        return ("worker", args["worker"])
    if kind == "cut_link":
        return ("link", (args["src"], args["dst"]))
    return None


def _recovery_report(db: Path, name: str) -> list[str]:
    """Per applied command: when the next group formed after it completed, and for a kill or a
    cut, when the coordinator noticed and when the first group without the dead part ended."""
    lines = [f"scenario {name}: seconds from each command to what followed"]
    groups = completed_groups(db)
    events = rows(db, "SELECT t, kind, message FROM events ORDER BY t")
    for c in _applied(db):
        # From submission: the injector acts in the same poll, and applied_at is stamped only
        # once a kill has been reaped, by when the coordinator may already have reacted.
        t0 = c["t"]
        after = [g for g in groups if g["formed_at"] >= c["applied_at"]]
        nxt = f"{after[0]['ended_at'] - t0:6.1f}" if after else "  none"
        line = f"  #{c['id']:<3} {c['reason']:<36} next group {nxt}"
        target = _fault_target(c["kind"], json.loads(c["args"]))
        if target is not None:
            kind, what = target
            if kind == "worker":
                noticed = [
                    e for e in events if e["t"] >= t0 and f"worker {what} lost" in e["message"]
                ]
                clean = [g for g in after if what not in _members(g)]
            else:
                s, d = what  # a one-way cut may be reported by either direction (TCP's ACKs)
                noticed = [
                    e
                    for e in events
                    if e["t"] >= t0
                    and e["kind"] == "fault"
                    and (
                        f"link {s}->{d} failed" in e["message"]
                        or f"link {d}->{s} failed" in e["message"]
                    )
                ]
                clean = [g for g in after if (s, d) not in _edges(g)]
            seen = f"{noticed[0]['t'] - t0:6.1f}" if noticed else "     -"
            ok = f"{clean[0]['ended_at'] - t0:6.1f}" if clean else "  none"
            line += f", noticed {seen}, first group without it {ok}"
        lines.append(line)
    revised = [g for g in groups if g["revisions"]]
    abandoned = rows(db, "SELECT id, reason FROM groups WHERE status='abandoned'")
    lines.append(
        f"  {len(groups)} completed ({len(revised)} after a re-plan),"
        f" {len(abandoned)} abandoned: "
        + "; ".join(f"#{a['id']} {a['reason']}" for a in abandoned[:6])
    )
    return lines


def _scenario_specific(case: Case, lab: LabRun, sc: Scenario) -> Callable[[], bool]:
    """What must also have happened before the run may end (the scenario hit its target)."""
    db = lab.db_path

    def applied(kind: str) -> list[sqlite3.Row]:
        return [c for c in _applied(db) if c["kind"] == kind]

    if case.file == "worker-crash-and-rejoin":

        def rejoined() -> bool:
            restart = applied("restart_worker")
            return bool(restart) and any(
                1 in _members(g) for g in completed_groups(db, restart[0]["applied_at"])
            )

        return rejoined
    if case.file.startswith("link-cut"):
        cut = next(s.command for s in sc.steps if s.command.KIND.value == "cut_link")

        def failed_over() -> bool:
            # ... and the group failed over ended: it is followed to its end, since its
            # revision can take longer than several later groups.
            moved = _failovers(db, cut.src, cut.dst)
            if not moved:
                return False
            group = json.loads(moved[0]["data"])["group"]
            return rows(db, "SELECT status FROM groups WHERE id=?", (group,))[0]["status"] != "open"

        return failed_over
    if case.file in PACED:
        # Run on past the last repair until the pace is back (a 10 s window from within
        # PACE_BACK_S of it reaches RECOVERED of the baseline), or long enough to see it is not.
        started = float(rows(db, "SELECT value FROM meta WHERE key='started_at'")[0]["value"])

        def paced() -> bool:
            if len(_applied(db)) < len(sc.steps):
                return False
            last = max(c["applied_at"] for c in _applied(db))
            now = time.time()
            if now >= last + PACE_BACK_S + WINDOW_S:
                return True
            return _pace(db, started, now).recovered_after_s is not None

        return paced
    if case.file == "random-link-failures":
        return lambda: bool(
            rows(
                db, "SELECT id FROM events WHERE kind='recovery' AND message LIKE '%failed during%'"
            )
        )
    return lambda: True


def _pace(db: Path, start: float, end: float) -> Pace:
    conn = sqlite3.connect(db)
    try:
        return read_pace(conn, start, end)
    finally:
        conn.close()


def _timeline(db: Path, start: float, pace: Pace) -> list[str]:
    """What the coordinator and the lab recorded around the worst window, for a failure's
    message (CI keeps only the assertion, not the run's files)."""
    if pace.worst_at_s is None:
        return []
    a, b = start + pace.worst_at_s - WINDOW_S, start + pace.worst_at_s + 2 * WINDOW_S
    got = rows(
        db,
        "SELECT t, kind, message FROM events WHERE t BETWEEN ? AND ?"
        " AND kind IN ('fault', 'recovery', 'coordinator', 'worker', 'command', 'capacity')"
        " ORDER BY t LIMIT 80",
        (a, b),
    )
    return [f"{r['t'] - start:.1f} {r['kind']}: {r['message'][:100]}" for r in got]


def _check_scenario_after(case: Case, db: Path, sc: Scenario, extra: dict) -> None:
    applied = _applied(db)
    if case.file == "worker-crash":
        # Killed while a member of an open group (Case.hurry): that group ended, re-planned
        # without it or abandoned; the survivors' groups go on without it; it is recorded dead.
        kill = applied[0]
        assert kill["kind"] == "kill_worker"
        (g,) = rows(db, "SELECT * FROM groups WHERE id=?", (extra["mid_reduce"][1],))
        assert g["status"] in ("completed", "abandoned")
        if g["status"] == "completed" and g["revisions"] > 0:
            assert 1 not in _members(g), "the survivors' average kept the dead worker"
        later = completed_groups(db, kill["applied_at"])
        assert later and all(1 not in _members(g) for g in later), "a dead worker was averaged"
        dead = rows(db, "SELECT state FROM worker_status WHERE worker=1")
        history = [
            (r["t"] - kill["applied_at"], r["state"])
            for r in rows(db, "SELECT t, state FROM worker_states WHERE worker=1 ORDER BY t")
        ]
        said = [r["message"] for r in rows(db, "SELECT message FROM events WHERE worker=1")]
        assert dead and dead[0]["state"] == "dead", (
            f"worker 1 is {[r['state'] for r in dead]}; its states since the kill (s, state):"
            f" {history}; its events: {said}"
        )
        assert extra["exit_codes"].get(1) == -signal.SIGKILL
    elif case.file == "worker-crash-and-rejoin":
        kill, restart = applied[0], applied[1]
        assert (kill["kind"], restart["kind"]) == ("kill_worker", "restart_worker")
        down = rows(
            db,
            "SELECT * FROM groups WHERE status='completed' AND formed_at >= ? AND formed_at < ?",
            (kill["applied_at"] + 1.0, restart["applied_at"]),
        )
        assert all(1 not in _members(g) for g in down), "a dead worker was averaged"
        # The new process resumed from the model of one of its committed groups (the newest it
        # saved), not from scratch: its first reported iteration continues that count.
        committed = {
            r["iteration"]
            for r in rows(
                db,
                "SELECT gm.iteration FROM group_members gm JOIN groups g ON g.id = gm.group_id"
                " WHERE gm.worker=1 AND g.status='completed' AND g.formed_at < ?",
                (kill["applied_at"],),
            )
        }
        first = rows(
            db,
            "SELECT MIN(iteration) AS k FROM iterations WHERE worker=1 AND t > ?",
            (restart["applied_at"],),
        )[0]["k"]
        assert committed, "worker 1 never committed a group before it was killed"
        assert first is not None and first - 1 in committed, (
            f"worker 1 restarted at iteration {first}, not after a committed group {committed}"
        )
    elif case.file.startswith("link-cut"):
        # The group cut in flight was re-planned and completed; no group formed after the cut
        # is planned over the dead link until it is restored (or the coordinator's retry timer
        # puts it back in plans); every result was exact (checked for all groups).
        cut = next(c for c in applied if c["kind"] == "cut_link")
        restore = next(c for c in applied if c["kind"] == "restore_link")
        a = json.loads(cut["args"])
        s, d = a["src"], a["dst"]
        group = json.loads(_failovers(db, s, d, cut["applied_at"])[0]["data"])["group"]
        (g,) = rows(db, "SELECT * FROM groups WHERE id=?", (group,))
        history = [
            e["message"]
            for e in rows(
                db,
                "SELECT message FROM events WHERE kind IN ('recovery', 'group') AND t >= ?",
                (cut["applied_at"],),
            )
        ]
        assert g["status"] == "completed" and g["revisions"] > 0, (
            f"group {group}, cut in flight, ended {g['status']} after {g['revisions']}"
            f" revision(s): {g['reason']}; events since the cut: {history}"
        )
        t1 = min(restore["applied_at"], cut["applied_at"] + RETRY_LINK_S)
        during = [g for g in completed_groups(db, cut["applied_at"]) if g["formed_at"] < t1]
        assert len(during) >= CUT_ANSWER_GROUPS, "too few groups between the cut and its repair"
        assert all((s, d) not in _edges(g) for g in during), "a plan used a dead link"
    elif case.file == "bandwidth-drop":
        rates = [
            r["rate_mbit"]
            for r in rows(db, "SELECT rate_mbit FROM link_state WHERE src=1 AND dst=2 ORDER BY id")
        ]
        configured = rows(db, "SELECT rate_mbit FROM links WHERE src=1 AND dst=2")[0][0]
        assert rates == [pytest.approx(configured * 0.1, abs=1e-3), pytest.approx(configured)]
    elif case.file == "contention":
        assert len(extra["flows"]) == 4, "the two contention flows (source, sink) did not start"
        assert all(p.poll() is not None for p in extra["flows"]), "a contention flow still runs"
    elif case.file in PACED:
        # The timeline is compressed x4, so the faults overlap even more than in the file;
        # the pace is still asserted on 10 s windows, as for the full-length run.
        start = rows(db, "SELECT value FROM meta WHERE key='started_at'")[0]["value"]
        pace = _pace(db, float(start), extra["settled_at"])  # not the lab's teardown after it
        print(f"pace: {pace.describe()}")
        # Only the killed worker may be lost; one lost to silence while it trained is the
        # coordinator's misjudgement (a CI run lost all eight after a stall, and p fell to 1).
        lost = rows(db, "SELECT message FROM events WHERE message LIKE '%lost: no heartbeat%'")
        timeline = _timeline(db, float(start), pace)
        assert not lost, [r["message"] for r in lost] + timeline
        assert pace.worst_share is not None and pace.worst_share >= PACE_MIN_SHARE, (
            pace,
            timeline,
        )
        assert pace.recovered_after_s is not None and pace.recovered_after_s <= PACE_BACK_S
    elif case.file == "coordinator-crash":
        kills = [c for c in applied if c["kind"] == "kill_coordinator"]
        assert len(kills) == 2
        for k in kills:
            after = completed_groups(db, k["applied_at"])
            assert after, "no group completed after the coordinator was killed"
            back = min(g["ended_at"] for g in after) - k["applied_at"]
            assert back <= COORDINATOR_BACK_S, "\n".join(
                [
                    f"groups completed again only {back:.1f} s later",
                    *_recovery_report(db, case.file),
                ]
            )
        restarted = rows(db, "SELECT t FROM events WHERE message LIKE 'coordinator restarted by%'")
        assert len(restarted) == 2
    elif case.file == "random-link-failures":
        cut = rows(db, "SELECT src, dst, up FROM link_state")
        assert len(cut) == 20 and not any(r["up"] for r in cut)
        assert len({(r["src"], r["dst"]) for r in cut}) == 20


@pytest.mark.parametrize("case", CASES, ids=[c.file for c in CASES])
def test_shipped_scenario(tmp_path: Path, case: Case) -> None:
    topo = load_topology(case.topology)
    caps = check(topo)
    sc = load_scenario(
        SCENARIOS / f"{case.file}.yaml",
        topo.n,
        limits=lab_limits(topo, caps),
        rates=topo.bw_matrix(),
        time_scale=case.scale,
    )
    run_dir = tmp_path / "run"
    extra: dict = {"flows": [], "mid_reduce": {}}
    state_dir = tmp_path / "state"
    with LabRun(topo, caps, small_opts(p=case.p), run_dir, state_dir=state_dir) as lab:
        db = lab.db_path
        wait_until(
            lab, lambda: len(completed_groups(db)) >= WARM_GROUPS, WARM_WAIT_S, "the first groups"
        )
        # LabRun plays lab.player on every poll; it is attached now so the clock starts warm.
        lab.player = ScenarioPlayer(sc, db, start_time=time.time())
        player = lab.player
        hit = _scenario_specific(case, lab, sc)
        last = max(s.trigger.value for s in sc.steps)

        def settled() -> bool:
            if lab.faults is not None:  # remember contention flows to check they stop
                for procs in lab.faults.flows.values():
                    extra["flows"] += [p for p in procs if p not in extra["flows"]]
            if case.hurry:
                _hurry(lab, sc, extra["mid_reduce"])
            return (
                player.done
                and not rows(db, "SELECT id FROM commands WHERE status='pending'")
                and not _unanswered(db)
                and (not case.hurry or _answered(db, topo.n))  # the last step too
                and hit()
            )

        wait_until(
            lab,
            settled,
            last + SETTLE_WAIT_S,
            f"every step of {case.file} applied and followed by a completed group",
        )
        extra["settled_at"] = time.time()
        extra["exit_codes"] = dict(lab.exit_codes)
        pids, tag = lab_pids(lab), lab.tag
    print("\n" + "\n".join(_recovery_report(db, case.file)))
    assert_nothing_left(tag, pids, state_dir)

    commands = rows(db, "SELECT kind, status, reason FROM commands ORDER BY id")
    assert len(commands) == len(sc.steps)
    assert all(c["status"] == "applied" for c in commands), [dict(c) for c in commands]
    done = completed_groups(db)
    bad = [
        (g["id"], g["verify_err"])
        for g in done
        if g["verify_err"] is None or not g["verify_err"] < EXACT
    ]
    assert not bad, f"groups averaged wrongly: {bad}"
    assert not rows(db, "SELECT id FROM groups WHERE status='open'"), "a group was left open"
    _check_scenario_after(case, db, sc, extra)
    report = lab_audit.audit(run_dir)
    assert report.ok, [(c.name, c.detail) for c in report.violations]


# -- the lab process killed and started again --------------------------------------------------


def _lab_argv(run_dir: Path, duration: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lab.run",
        "--topology",
        str(SMALL),
        "--p",
        "2",
        "--width",
        "256",
        "--depth",
        "2",
        "--part-bytes",
        "65536",
        "--no-dashboard",
        "--duration",
        str(duration),
        "--out",
        str(run_dir),
        "--log-level",
        "WARNING",
    ]


def _start_lab(run_dir: Path, duration: float, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            _lab_argv(run_dir, duration), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )


def _wait_groups(proc: subprocess.Popen, run_dir: Path, log: Path, what: str) -> Path:
    """Wait until the lab writing ``run_dir`` completed two groups; its database."""
    db = run_dir / "lab.db"
    _wait_proc(proc, lambda: _db_completed(db) >= 2, WARM_WAIT_S, what, log)
    return db


def _state_of(owner_pid: int) -> LabState | None:
    """The state file (in the default state dir: lab.run has no option for another) whose
    owner is ``owner_pid``."""
    for path in sorted(DEFAULT_STATE_DIR.glob("*.json")):
        try:
            st = LabState.load(path)
        except StateError:
            continue
        if st.owner.pid == owner_pid:
            return st
    return None


def _wait_proc(
    proc: subprocess.Popen, predicate: Callable[[], bool], timeout: float, what: str, log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(
                f"lab.run exited ({proc.returncode}) before {what}\n"
                f"{log.read_text(errors='replace')[-3000:]}"
            )
        time.sleep(POLL_S)
    pytest.fail(f"timed out waiting for {what}\n{log.read_text(errors='replace')[-3000:]}")


def _db_completed(db: Path) -> int:
    if not db.is_file():
        return 0
    try:
        return rows(db, "SELECT COUNT(*) FROM groups WHERE status='completed'")[0][0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _remove_dead_lab(state: LabState | None) -> None:
    """Remove what a lab recorded, once its owner is gone (a failed test's safety net)."""
    if state is None or not state.path.exists() or state.owner_alive():
        return
    try:
        fresh = LabState.load(state.path)
    except StateError:
        return
    remove_recorded(fresh, CleanupReport())
    fresh.remove_file()


def _end(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)  # lab.run treats it as Ctrl-C: a full teardown
    try:
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_sigkilled_lab_is_cleaned_up_by_the_next_run(tmp_path: Path) -> None:
    first = second = None
    st1 = st2 = None
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    try:
        first = _start_lab(tmp_path / "run1", 120, log1)
        _wait_groups(first, tmp_path / "run1", log1, "the first lab's groups")
        st1 = _state_of(first.pid)
        assert st1 is not None, "the first lab wrote no state file"
        first.send_signal(signal.SIGKILL)  # its own pid only
        first.wait(10)
        st1 = LabState.load(st1.path)  # as the lab last saved it
        kinds = {p.kind for p in st1.procs}
        assert {"coordinator", "proc"} <= kinds, kinds
        # Its coordinator and workers end by themselves (their parent-death signal)...
        deadline = time.monotonic() + CHILDREN_GONE_S
        while time.monotonic() < deadline and not all(
            _gone(p.pid, p.start_time) for p in st1.procs
        ):
            time.sleep(0.2)
        procs1 = [p for p in st1.procs if not _gone(p.pid, p.start_time)]
        assert not procs1, f"the killed lab's children run on: {procs1}"
        # ...but what it made in the kernel stays until the next lab cleans up after it.
        assert _tag_links(st1.tag), "the dead lab's interfaces are already gone"

        second = _start_lab(tmp_path / "run2", 180, log2)
        db2 = _wait_groups(second, tmp_path / "run2", log2, "the second lab's groups")
        st2 = _state_of(second.pid)
        assert st2 is not None
        # The second lab removed the first's leftovers before it built its own network.
        assert all(_gone(p.pid, p.start_time) for p in procs1), "the dead lab's processes live"
        assert not _tag_links(st1.tag), _tag_links(st1.tag)
        assert not st1.path.exists(), "the dead lab's state file was not removed"
        # The killed lab's run was closed: no group left open, and an end.
        db1 = tmp_path / "run1" / "lab.db"
        assert not rows(db1, "SELECT id FROM groups WHERE status = 'open'")
        assert rows(db1, "SELECT value FROM meta WHERE key = 'ended_at'")
        events = rows(db2, "SELECT message FROM events")
        assert events
        st2 = LabState.load(st2.path)
        procs2 = list(st2.procs)
        _end(second)
        assert second.returncode == 0, log2.read_text(errors="replace")[-3000:]
        assert all(_gone(p.pid, p.start_time) for p in procs2), "the second lab left processes"
        assert not _tag_links(st2.tag), _tag_links(st2.tag)
        assert not st2.path.exists(), "the second lab's state file was not removed"
        assert rows(db2, "SELECT value FROM meta WHERE key='ended_at'"), "no clean end"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        _remove_dead_lab(st1)
        _remove_dead_lab(st2)
