"""The leaderboard scorecard of one artifact: validation loss, generation and training throughput, as JSON.

    python bench/leaderboard.py                                   # the most-trained checkpoint under out/, on its data
    python bench/leaderboard.py --checkpoint out/demo/train --eval-text wiki.valid.raw --out score.json
    python bench/leaderboard.py --parallel fsdp --nproc-per-node 2   # training figures from a 2-rank torchrun job
    python bench/leaderboard.py --out score.json --resume            # finish what a failed or stopped run left
    python bench/leaderboard.py --out score.json --resume --only training_throughput_12   # just that figure

The five keys of the reference leaderboard keep their names (`loss`, `inference_latency_1`,
`inference_latency_12`, `training_throughput_4`, `training_throughput_12`); despite the name the
two "latency" figures are throughputs in new tokens per second (batch x new tokens / seconds),
as the reference computed them.  `units` and `definitions` in the output say so for every figure.

Training throughput runs train.py itself (under torchrun with --parallel), from the artifact's
weights, on --train-dataset, and reads tokens/s from its metrics.jsonl: the whole job's tokens per
second, all ranks together.  An int8 artifact cannot be trained; its training figures are those
of the float architecture it was quantized from (same config, fresh weights).

With --out, each figure is written there as soon as it is measured, with its status (`status`: measured, failed
with its cause in one line, or not measured and why), so a training run the OOM killer ends, or a stop, keeps the
figures measured before it; `--resume` measures the missing ones into the same file (`--only KEYS` chooses which).
"""
from __future__ import annotations

if __name__ == "__main__":  # first: a stop sent while the imports below take seconds is noted (runtime/stopping.py)
    from runtime.stopping import note_stops_while_starting
    note_stops_while_starting()

import json

from bench.eval.scorecard import LeaderboardConfig, scorecard
from runtime.cli import entry_point, parse_config


# A stop (SIGINT or SIGTERM) ends its training runs with it (bench/processes.py) and their temporary folder; a stop
# while it measures says what it kept (bench/eval/scorecard.py), one before says this.
@entry_point(interrupted="before the scorecard measured anything; nothing was written")
def main(argv=None) -> dict:
    args = parse_config(LeaderboardConfig, __doc__, argv)
    score = scorecard(args)  # written to --out as each figure was measured
    print(json.dumps(score, indent=2))
    return score


if __name__ == "__main__":
    main()
