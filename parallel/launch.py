"""torchrun whose end is the job's own last line: `python -m parallel.launch` takes torchrun's flags and runs its agent
(torch.distributed.run's `main`) in this process.

    python -m parallel.launch --nproc_per_node=4 train.py --parallel fsdp      # as torchrun --nproc_per_node=4 ...

How the job ends, and what the `torchrun` command would print instead:
- **A rank fails** (an error, a bug, a signal such as the kernel's OOM killer's SIGKILL): torchrun raises a
  ChildFailedError, which the `torchrun` command leaves to Python: a 25-line traceback and a table of every rank's
  exit under the failed rank's own message.  Here it is one line naming the rank that failed first and how (its exit
  status, or its signal, with "likely out of memory" for a SIGKILL no one sent on purpose), and the launcher exits 1,
  or 128 + the signal's number for a rank a signal ended, as a shell reports a command so ended.
- **The ranks stop** (a SIGTERM, SIGINT or SIGUSR1 sent to the ranks, each ending with its stop's status and rank 0
  with its closing line, `... exit status 143`): the launcher exits with that status, so a wrapper that requeues a
  job on 143 sees 143, where `torchrun` exits 1.
- **The launcher is stopped** (SIGINT or SIGTERM to it): torchrun's agent passes the signal to its workers, waits for
  them up to its --shutdown-timeout (then SIGKILLs them), and re-raises the signal as a SignalException
  (torch/distributed/elastic/agent/server/api.py, `SimpleElasticAgent.run`).  Here that ends the launcher with
  128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), as train.py does; the agent's own warnings ("Received
  2 death signal, shutting down workers", one "Sending process ... closing signal" per worker) still print.
"""
from __future__ import annotations

import logging
import signal
import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import main

# The statuses a rank ends with when it stopped on a signal it handles (training/stop_signals.py): 128 + the signal.
STOPPED_STATUSES = {128 + s for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
# The agent's logger says "failed (exitcode: 1) local_rank: 0 (pid: ...) of binary: ..." before the ChildFailedError;
# the launcher's own line says it once, in words.
AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def job_status(error: ChildFailedError) -> tuple[int, str | None]:
    """The launcher's exit status for a job whose ranks failed, and the line that says why (None when the ranks
    said it themselves: a stop's closing line)."""
    rank, failure = error.get_first_failure()
    if failure.exitcode in STOPPED_STATUSES:
        return failure.exitcode, None
    return (128 - failure.exitcode if failure.exitcode < 0 else 1), failure_line(rank, failure)


def failure_line(rank: int, failure: ProcessFailure) -> str:
    where = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid})"
    if failure.exitcode >= 0:
        return f"{where} failed first, with exit status {failure.exitcode} (its own message is above)"
    name = failure.signal_name()
    why = (": likely out of memory (the kernel's OOM killer sends SIGKILL; `dmesg` says so), so lower --batch-size "
           "(raising --grad-accum to keep the batch), use --activation-checkpointing, or more ranks"
           if -failure.exitcode == signal.SIGKILL else "")
    return f"error: {where} was ended by {name}{why}"


class _SaidByTheLauncher(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("failed (exitcode:")


if __name__ == "__main__":
    logging.getLogger(AGENT_LOGGER).addFilter(_SaidByTheLauncher())
    try:
        main()
    except SignalException as e:
        sys.exit(128 + e.sigval)
    except ChildFailedError as e:
        status, line = job_status(e)
        if line:
            print(line, file=sys.stderr, flush=True)
        sys.exit(status)
