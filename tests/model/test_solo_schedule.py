"""The fused decode stacks' solo rule (kernels/team.h SoloSchedule), driven step by step with
scripted lost-core flags: two lost steps in a row put the next 8 steps on one thread, a repeat
soon after doubles the period up to 64, 64 clean team steps make it short again, and one lost
step alone changes nothing."""

from __future__ import annotations

import pytest

from cadence.model.kernels.cpu_ops import load_cpu_kernels

kernels = load_cpu_kernels()
pytestmark = pytest.mark.skipif(kernels is None, reason="needs the CPU kernels built")


def solo_periods(teams: list[int]) -> list[int]:
    """Lengths of the runs of one-thread steps, in order."""
    periods, run = [], 0
    for team in teams:
        if team == 1:
            run += 1
        elif run:
            periods.append(run)
            run = 0
    return periods + ([run] if run else [])


def test_one_lost_step_alone_keeps_the_team():
    lost = [False, True, False, True, False, True] * 20
    assert set(kernels.solo_schedule_teams(lost, 2)) == {2}


def test_a_false_alarm_costs_the_short_period():
    teams = kernels.solo_schedule_teams([True, True] + [False] * 200, 2)
    assert teams[:2] == [2, 2] and solo_periods(teams) == [8]
    assert teams[2:10] == [1] * 8 and set(teams[10:]) == {2}


def test_a_neighbour_that_stays_busy_meets_doubling_periods_up_to_64():
    # Every team step loses its core: each solo period ends in two lost team steps.
    teams = kernels.solo_schedule_teams([True] * 400, 2)
    assert solo_periods(teams)[:5] == [8, 16, 32, 64, 64]


def test_clean_team_steps_make_the_next_period_short_again():
    lost = [True, True] + [False] * 8 + [True, True] + [False] * 16  # periods 8, then 16
    lost += [False] * 63 + [True, True] + [False] * 40              # 63 clean: still doubling
    lost += [False] * 70 + [True, True] + [False] * 20              # after 64 clean: short again
    assert solo_periods(kernels.solo_schedule_teams(lost, 2)) == [8, 16, 32, 8]


def test_one_thread_never_changes_anything():
    assert set(kernels.solo_schedule_teams([True] * 50, 1)) == {1}
