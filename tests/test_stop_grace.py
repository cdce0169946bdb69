"""How long a stop signal leaves before SIGKILL (training/stop_grace.py): torchrun's --shutdown-timeout read from its
command line and environment as its agent resolves it, whatever those hold."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.hostile import examples
from training.stop_grace import SCHEDULER_DEFAULT_S, TORCHRUN_DEFAULT_S, stop_grace, torchrun_grace

TORCHRUN = ["/usr/bin/python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]


def test_the_flag_wins_over_the_environment_which_wins_over_the_default():
    env = {"PET_SHUTDOWN_TIMEOUT": "20", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10"}
    assert torchrun_grace(env, [*TORCHRUN, "--shutdown-timeout", "60", "train.py"]).seconds == 60
    assert torchrun_grace(env, [*TORCHRUN, "--shutdown_timeout=45", "train.py"]).seconds == 45
    assert torchrun_grace(env, [*TORCHRUN, "train.py"]).seconds == 20
    assert torchrun_grace({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10"}, TORCHRUN).seconds == 10
    default = torchrun_grace({}, [*TORCHRUN, "train.py", "--max-steps", "5"])
    assert default.seconds == TORCHRUN_DEFAULT_S and default.source == "torchrun's default shutdown timeout"


def test_a_given_grace_wins_and_without_torchrun_the_schedulers_default_holds():
    assert stop_grace(12.5, under_torchrun=True).seconds == 12.5
    assert stop_grace(None, under_torchrun=False).seconds == SCHEDULER_DEFAULT_S


@examples(20)
@given(argv=st.lists(st.sampled_from(["--shutdown-timeout", "--shutdown_timeout=", "--shutdown-timeout=x", "60",
                                      "-5", "", "train.py", "1e3", "--shutdown_timeout"]) | st.text(max_size=12),
                     max_size=8),
       env=st.dictionaries(st.sampled_from(["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "OTHER"]),
                           st.text(max_size=6)))
def test_any_launcher_command_line_and_environment_give_a_grace_of_zero_or_more_and_say_where_from(argv, env):
    grace = torchrun_grace(env, [*TORCHRUN, *argv])
    assert grace.seconds >= 0 and grace.source
