"""runtime/host_load.py: other programs' use of the process's cores, read from the kernel's counters, counts only
the last half second; a host whose counters cannot be read reads as quiet."""
from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.host_load import QUIET_CORES, READ_EVERY_S, WINDOW_S, CpuRead, HostLoad, busy_ticks, others_between, \
    read_proc_stat
from tests.scripted_host import ScriptedHost

PROC_STAT = """cpu  300 5 100 9000 20 0 10 0 0 0
cpu0 100 0 50 4000 10 0 5 0 0 0
cpu1 200 5 50 5000 10 0 5 7 0 0
intr 12345 0 0
ctxt 999
"""


def test_busy_ticks_sum_every_state_but_idle_and_iowait_of_the_process_cores_alone():
    assert busy_ticks(PROC_STAT, None) == 155 + 267
    assert busy_ticks(PROC_STAT, {1}) == 267
    assert busy_ticks(PROC_STAT, {5}) == 0


@given(st.text())
def test_any_text_read_as_proc_stat_gives_a_count_and_never_an_error(text):
    assert busy_ticks(text, None) >= 0 and busy_ticks(text, {0}) >= 0


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="a host without /proc/stat reads as quiet")
def test_this_host_s_counters_are_read():
    before = read_proc_stat()
    sum(range(10**6))  # this process's own work
    after = read_proc_stat()
    assert after.busy_s >= before.busy_s and after.own_s > before.own_s and others_between(before, after) >= 0


def test_others_are_the_busy_time_less_the_process_s_own_over_the_wall_time():
    assert others_between(CpuRead(0.0, 10.0, 1.0), CpuRead(2.0, 13.0, 2.0)) == pytest.approx(1.0)
    assert others_between(CpuRead(0.0, 10.0, 1.0), CpuRead(2.0, 10.5, 2.0)) == 0.0  # ticks coarser than own time
    assert others_between(CpuRead(1.0, 0.0, 0.0), CpuRead(1.0, 5.0, 0.0)) == 0.0  # no time passed


def advance(host: ScriptedHost, seconds: float, every_s: float = 0.02) -> list[float]:
    """What `others` says every `every_s` for `seconds`."""
    seen = []
    end = host.clock.now + seconds
    while host.clock.now < end:
        host.clock.now += every_s
        seen.append(host.load.others())
    return seen


def test_a_load_is_seen_within_the_window_and_forgotten_as_soon_after_it_ends():
    host = ScriptedHost()
    assert max(advance(host, 5.0)) == 0.0
    host.others = 1.0
    seen = advance(host, 10.0)
    assert seen[-1] == pytest.approx(1.0)
    assert all(value == pytest.approx(1.0) for value in seen[int((WINDOW_S + 2 * READ_EVERY_S) / 0.02):])
    host.others = 0.0
    seen = advance(host, 2.0)
    assert all(value == 0.0 for value in seen[int((WINDOW_S + 2 * READ_EVERY_S) / 0.02):])
    assert host.load.quiet()


def test_a_load_long_before_a_pause_is_not_counted_after_it():
    host = ScriptedHost()
    host.others = 2.0
    advance(host, 3.0)
    host.others = 0.0
    host.clock.now += 60.0  # no step for a minute
    assert host.load.others() == 0.0  # one read after the pause: nothing known of it yet, the old span dropped
    assert advance(host, 0.3)[-1] == 0.0


def test_a_span_is_quiet_when_other_programs_used_less_than_a_quarter_core():
    host = ScriptedHost()
    mark = host.load.mark()
    host.others = QUIET_CORES / 2
    host.clock.now += 1.0
    assert host.load.quiet_since(mark)
    host.others = 1.0
    host.clock.now += 1.0
    assert not host.load.quiet_since(mark)
    assert host.load.quiet_since(None)  # no mark (counters unreadable): quiet


def test_a_host_whose_counters_cannot_be_read_is_quiet_and_all_its_cores_free():
    load = HostLoad(read=lambda: None, cores=4)
    assert load.others() == 0.0 and load.free_cores() == 4 and load.quiet() and load.quiet_since(load.mark())
