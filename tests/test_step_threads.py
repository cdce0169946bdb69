"""decode/step_threads.py: decode steps run on the cores other programs leave free -- all threads on a quiet machine,
fewer beside a busy program -- and are back on all of them within a second of the load's end, however long it
lasted (issue 70: a choice made under load outlived it)."""
from __future__ import annotations

import pytest
import torch

from decode.step_threads import StepThreads
from runtime.host_load import WINDOW_S
from tests.scripted_host import ScriptedHost


@pytest.fixture(autouse=True)
def caller_threads():
    """The choosers here set the process's thread count: each test gives the count back, pass or fail."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def run_steps(host: ScriptedHost, chooser: StepThreads, seconds: float, step_s: float = 0.02) -> list[int]:
    """Steps of `step_s` each for `seconds` of the host's clock: the thread count each ran with."""
    used = []

    def step():
        used.append(torch.get_num_threads())
        host.clock.now += step_s
    end = host.clock.now + seconds
    while host.clock.now < end:
        chooser.run(step)
    return used


@pytest.mark.parametrize("busy_s", [1.0, 60.0])
def test_quiet_then_one_busy_core_then_quiet_is_all_threads_one_thread_all_threads_again(busy_s):
    host = ScriptedHost(cores=2)
    chooser = StepThreads(most=2, load=host.load)
    assert set(run_steps(host, chooser, 20.0)) == {2}
    host.others = 1.0  # another program takes a core
    busy = run_steps(host, chooser, busy_s)
    assert set(busy[-int(0.5 * busy_s / 0.02):]) == {1}  # on one thread within the first half of the load
    assert busy.index(1) * 0.02 <= 2 * WINDOW_S
    host.others = 0.0
    after = run_steps(host, chooser, 5.0)
    # back on both within two windows (a second) of the load's end, however long it lasted: the goal is 2 s or 50
    # steps, whichever comes first
    back = after.index(2)
    assert back * 0.02 <= 2 * WINDOW_S and set(after[back:]) == {2}
    # Between steps the chosen count stays set (an idle thread woken there took a core's share from the next
    # step), until the caller takes its own count back.
    host.others = 1.0
    run_steps(host, chooser, 2.0)
    assert torch.get_num_threads() == 1
    chooser.release()
    assert torch.get_num_threads() == 2


def test_a_host_busier_than_its_cores_still_decodes_on_one_thread_and_a_light_load_leaves_all():
    host = ScriptedHost(cores=2)
    chooser = StepThreads(most=2, load=host.load)
    host.others = 6.0  # more runnable programs than cores: the counters cannot show more than both cores
    assert set(run_steps(host, chooser, 5.0)[-100:]) == {1}
    host.others = 0.3  # a shell, a daemon: a step's threads still have both cores
    assert set(run_steps(host, chooser, 5.0)[-100:]) == {2}


def test_a_process_allowed_fewer_threads_than_cores_uses_its_own_count():
    host = ScriptedHost(cores=16)
    chooser = StepThreads(most=4, load=host.load)
    host.others = 10.0  # six cores left: more than the process's four threads
    assert set(run_steps(host, chooser, 3.0)[-50:]) == {4}
    host.others = 14.0
    assert set(run_steps(host, chooser, 3.0)[-50:]) == {2}


def test_generate_gives_its_caller_the_thread_count_back_whatever_its_steps_chose(monkeypatch, small_model):
    from decode import steps as decode_steps
    from decode.generate import generate
    from decode.sampling import SamplingParams
    host = ScriptedHost(cores=2)
    host.others = 1.0
    run_steps(host, StepThreads(most=2, load=host.load), 1.0)  # the window has seen the busy core
    monkeypatch.setattr(decode_steps, "StepThreads", lambda: StepThreads(most=2, load=host.load))
    torch.set_num_threads(2)
    used = []
    generate(small_model, torch.zeros(1, 4, dtype=torch.long),
             SamplingParams(max_new_tokens=6, temperature=0, stop_at_eot=False), decode="dynamic",
             on_token=lambda token: used.append(torch.get_num_threads()))
    assert used[1:] == [1] * 5  # between steps the steps' count, for the sampling too
    assert torch.get_num_threads() == 2
