"""The leaderboard scorecard of one artifact: validation loss, generation and training throughput, as JSON.

    python bench/leaderboard.py                                   # the most-trained checkpoint under out/, on its data
    python bench/leaderboard.py --checkpoint out/demo/train --eval-text wiki.valid.raw --out score.json
    python bench/leaderboard.py --parallel fsdp --nproc-per-node 2   # training figures from a 2-rank torchrun job

The five keys of the reference leaderboard keep their names (`loss`, `inference_latency_1`,
`inference_latency_12`, `training_throughput_4`, `training_throughput_12`); despite the name the
two "latency" figures are throughputs in new tokens per second (batch x new tokens / seconds),
as the reference computed them.  `units` and `definitions` in the output say so for every figure.

Training throughput runs train.py itself (under torchrun with --parallel), from the artifact's
weights, on --train-dataset, and reads tokens/s from its metrics.jsonl: the whole job's tokens per
second, all ranks together.  An int8 artifact cannot be trained; its training figures are those
of the float architecture it was quantized from (same config, fresh weights).
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import json

from bench.eval.scorecard import LeaderboardConfig, scorecard
from runtime.cli import entry_point, parse_config
from storage.folder import write_durably


# A stop (SIGINT or SIGTERM) ends its training runs with it (bench/processes.py) and their temporary folder.
@entry_point(interrupted="before the scorecard was complete; nothing was written")
def main(argv=None) -> dict:
    args = parse_config(LeaderboardConfig, __doc__, argv)
    score = scorecard(args)
    text = json.dumps(score, indent=2)
    print(text)
    if args.out:  # written beside and renamed into place: a stop never leaves half a scorecard at --out
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_durably(args.out, text + "\n")
    return score


if __name__ == "__main__":
    main()
