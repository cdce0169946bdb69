"""The fault drills, one module each: what a reader, a kill -9, a poisoned request, slow clients, a dead rank, a full
disk, a hostile folder and a stop beyond the launcher's grace cost.  Each module's docstring says what its drill does and what counts as a failure,
and its `run(settings, work)` returns a `Drill` (bench/drills/drill.py).  `python -m bench.experiments faults`
runs them all, in this order, into bench/results/faults.json; adding a drill is adding its module and its line
below.
"""
from __future__ import annotations

from bench.drills import (disk_full, hostile_contents, kill_during_saves, killed_rank, poison_request,
                          readers_during_saves, restarted_rank, stop_beyond_grace, tricklers_vs_health)

DRILLS = (readers_during_saves, kill_during_saves, poison_request, tricklers_vs_health, killed_rank, restarted_rank,
          disk_full, hostile_contents, stop_beyond_grace)
