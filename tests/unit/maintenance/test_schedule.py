"""The schedule is a pure function of its intervals and the times it is given."""

from __future__ import annotations

from checkpoint_vault.maintenance import Schedule


def test_each_task_is_due_one_interval_after_the_start_and_after_each_run() -> None:
    s = Schedule({"gc": 60.0, "scrub": 600.0, "compact": 30.0}, now=1000.0)
    assert s.next() == ("compact", 1030.0)
    s.ran("compact", 1031.0)
    assert s.next() == ("gc", 1060.0)
    s.ran("gc", 1075.0)  # a long run: due again one interval after it ended
    assert s.next() == ("compact", 1061.0)
    s.ran("compact", 1061.0)
    assert s.next() == ("compact", 1091.0)
    s.ran("compact", 1091.0)
    assert s.next() == ("compact", 1121.0)
    s.ran("compact", 1121.0)
    assert s.next() == ("gc", 1135.0)


def test_an_interval_of_zero_never_runs_and_nothing_scheduled_is_none() -> None:
    s = Schedule({"gc": 0.0, "tiering": -1.0, "scrub": 5.0}, now=0.0)
    assert s.next() == ("scrub", 5.0)
    s.ran("scrub", 5.0)
    assert s.next() == ("scrub", 10.0)
    assert Schedule({"gc": 0.0}, now=0.0).next() is None


def test_ties_go_to_the_first_task_in_the_intervals_order() -> None:
    s = Schedule({"retention": 10.0, "gc": 10.0}, now=0.0)
    assert s.next() == ("retention", 10.0)
