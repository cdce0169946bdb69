"""torchrun whose stop ends in the job's own closing line: `python -m parallel.launch` takes torchrun's flags and runs
its agent (torch.distributed.run's `main`) in this process.

    python -m parallel.launch --nproc_per_node=4 train.py --parallel fsdp      # as torchrun --nproc_per_node=4 ...

On SIGINT or SIGTERM torchrun's agent passes the signal to its workers, waits for them up to its --shutdown-timeout
(then SIGKILLs them), and re-raises the signal as a SignalException (torch/distributed/elastic/agent/server/api.py,
`SimpleElasticAgent.run`), which the `torchrun` command leaves to Python: a 25-line traceback under the workers'
closing line, whatever the workers did.  That handler is in the launcher, not in anything a worker can change.  Here
the exception ends the launcher with 128 + the signal's number instead (130 for Ctrl-C, 143 for SIGTERM), as train.py
does; the agent's own warnings ("Received 2 death signal, shutting down workers", one "Sending process ... closing
signal" per worker) still print, as they do under torchrun.
"""
from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main

if __name__ == "__main__":
    try:
        main()
    except SignalException as e:
        sys.exit(128 + e.sigval)
