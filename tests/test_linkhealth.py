"""Link health as a pure module: link events and time in, reports and suspects out. No root."""

from __future__ import annotations

import pytest

from crew.control.capacity import RETRY_LINK_S, CapacityView, LinkChange
from crew.control.linkhealth import (
    SUSPECT_PEERS,
    SUSPECT_S,
    Deferral,
    LinkHealthTracker,
    LinkNote,
    LinkReport,
)
from crew.control.records import Level
from crew.wire import protocol as proto

ALL = range(6)


def tracker(n: int = 6, *, measured: bool = False) -> LinkHealthTracker:
    bw = [[0.0 if i == j else 100.0 for j in range(n)] for i in range(n)]
    return LinkHealthTracker(CapacityView(bw, measured=measured))


# -- link events -------------------------------------------------------------------------------


def test_a_sender_failure_is_news_once_but_always_dead() -> None:
    t = tracker()
    first = t.sender_failed(1, 2, "reset by peer", 1.0)
    assert first.notes == (LinkNote(LinkChange.FAILED, 1, 2, 0.0, 100.0, "reset by peer"),)
    assert first.changed and first.failed == ((1, 2),) and first.dead == ((1, 2),)
    assert t.capacity.planning[1, 2] == 0.0
    again = t.sender_failed(1, 2, "reset by peer", 1.5)
    assert again == LinkReport(dead=((1, 2),))  # no news, nothing new to suspect, still dead
    assert not again.changed


@pytest.mark.parametrize(("src", "dst"), [(1, 1), (6, 0), (0, -1)])
def test_a_sender_failure_of_no_link_is_refused(src: int, dst: int) -> None:
    with pytest.raises(proto.ProtocolError, match="not a link of this run"):
        tracker().sender_failed(src, dst, "x", 1.0)


def test_a_dead_probe_takes_both_directions_and_says_whose_probes_are_missing() -> None:
    t = tracker()
    report = t.probed(2, [0], 1.0)  # receiver 2 gets no probes from 0
    assert [(n.change, n.src, n.dst) for n in report.notes] == [
        (LinkChange.DEAD, 0, 2),
        (LinkChange.DEAD, 2, 0),
    ]
    assert report.notes[0].reason == "no probes arrive"
    assert report.notes[1].reason == "no probes arrive on 0->2, which carries its ACKs"
    assert report.failed == report.dead == ((0, 2), (2, 0))
    assert t.probed(2, [0], 1.5) == LinkReport()  # the same state: nothing new
    back = t.probed(2, [], 2.0)
    assert {(n.change, n.src, n.dst) for n in back.notes} == {
        (LinkChange.ALIVE, 0, 2),
        (LinkChange.ALIVE, 2, 0),
    }
    assert back.failed == back.dead == ()


def test_a_probe_report_naming_no_worker_is_refused() -> None:
    t = tracker()
    with pytest.raises(proto.ProtocolError, match="names no worker"):
        t.probed(2, [0, 9], 1.0)
    with pytest.raises(proto.ProtocolError, match="names no worker"):
        t.check_down([-1])
    assert t.capacity.dead == set()  # refused before any change


def test_a_sender_failed_link_returns_after_its_probes_pass_and_its_wait() -> None:
    t = tracker()
    t.sender_failed(0, 1, "stalled", 1.0)
    t.probed(1, [], 1.5)  # probes pass after the failure
    assert t.retry_due(1.0 + RETRY_LINK_S - 0.1) == LinkReport()
    report = t.retry_due(1.0 + RETRY_LINK_S)
    assert report.notes == (LinkNote(LinkChange.RETRIED, 0, 1, 100.0, 0.0),)
    assert report.failed == report.dead == ()


def test_measured_drift_is_a_note_only_when_the_run_plans_on_measurements() -> None:
    slow = [[0.0, 1e6, 1.0]]  # 8 Mbit/s from 0: far below the planned 100
    assert tracker().measured(1, slow) == LinkReport()
    (note,) = tracker(measured=True).measured(1, slow).notes
    assert note.change is LinkChange.DRIFTED and (note.src, note.dst) == (0, 1)
    assert note.mbit < note.was == 100.0


def test_each_note_records_its_kind_level_and_link() -> None:
    rows = {change: LinkNote(change, 3, 4, 5.0, 50.0, "why").record(7.0) for change in LinkChange}
    assert {c: (r.kind, r.level) for c, r in rows.items()} == {
        LinkChange.FAILED: ("fault", Level.WARNING),
        LinkChange.DEAD: ("fault", Level.WARNING),
        LinkChange.RETRIED: ("recovery", Level.INFO),
        LinkChange.ALIVE: ("recovery", Level.INFO),
        LinkChange.DRIFTED: ("capacity", Level.INFO),
    }
    assert all(r.t == 7.0 and "link 3->4" in r.message for r in rows.values())
    assert rows[LinkChange.FAILED].message == "link 3->4 failed: why"
    assert rows[LinkChange.DEAD].data == {"src": 3, "dst": 4, "probe": True}
    assert rows[LinkChange.DRIFTED].data == {"src": 3, "dst": 4, "mbit": 5.0, "was": 50.0}


# -- suspects ----------------------------------------------------------------------------------


def test_failed_links_to_enough_peers_make_their_common_end_suspect_for_a_while() -> None:
    t = tracker()
    assert SUSPECT_PEERS == 2
    assert t.suspect(5, 2, ALL, 1.0) == frozenset()  # one link names no culprit
    assert t.suspect(4, 2, ALL, 1.5) == {2}  # the second peer: 2 is the common end
    assert t.suspect(3, 2, ALL, 1.6) == frozenset()  # suspect already: not new
    assert t.suspects(1.6 + SUSPECT_S - 0.01) == {2}
    assert t.suspects(1.6 + SUSPECT_S) == frozenset()


def test_failures_further_apart_than_the_suspect_time_name_no_one() -> None:
    t = tracker()
    t.suspect(5, 2, ALL, 1.0)
    assert t.suspect(4, 2, ALL, 1.0 + SUSPECT_S) == frozenset()


def test_links_to_a_lost_worker_count_against_neither_end() -> None:
    t = tracker()
    alive = [0, 1, 2, 3, 4]  # 5 is lost: all its links fail
    for peer in (0, 1, 2):
        assert t.suspect(5, peer, alive, 1.0) == frozenset()
    assert t.suspect(3, 0, alive, 1.1) == frozenset()  # 0's only failure with a live peer
    assert t.suspects(1.1) == frozenset()


# -- deferral ----------------------------------------------------------------------------------


def test_deferral_holds_the_poorly_reached_and_the_live_suspects() -> None:
    t = tracker()
    t.probed(5, [0, 1, 2, 3, 4], 1.0)  # 5's links are all cut, both ways: it is reached at 0
    t.suspect(0, 1, ALL, 1.0)
    t.suspect(2, 1, ALL, 1.0)  # 1 is suspect
    d = t.deferral(ALL, 1.0)
    assert d.poor == {5} and d.workers == {1, 5}
    assert t.deferral([0, 2, 3, 4, 5], 1.0).workers == {5}  # a lost suspect: not deferred


def test_deferral_notes_say_why_and_follow_what_the_former_applied() -> None:
    d = Deferral(frozenset({1, 5}), frozenset({5}), {w: 100.0 for w in range(5)} | {5: 10.0})
    rows = d.notes(frozenset({3}), frozenset({1, 5}), 10.0, 2.0)
    assert [(r.worker, r.message.split(":")[0]) for r in rows] == [
        (1, "worker 1 deferred"),
        (5, "worker 5 deferred"),
        (3, "worker 3 no longer deferred"),
    ]
    assert "suspect" in rows[0].message and rows[0].data is not None and rows[0].data["suspect"]
    assert "10.0 Mbit/s (median worker 100.0)" in rows[1].message
    assert "after 10 s" in rows[1].message and rows[2].message.endswith("100.0 Mbit/s")
    # a former of fixed groups applies no deferral: nothing to record
    assert d.notes(frozenset(), frozenset(), 0.0, 2.0) == []
