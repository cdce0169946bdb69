"""The evaluation commands users run: a model's perplexity over a whole split (`perplexity.py`), the scorecard's
measurement (`scorecard.py`, whose command is bench/leaderboard.py), lm-evaluation-harness against our server
(`harness.py`), a load test of a running server (`loadtest.py`) and several training runs' curves in one picture
(`plot_runs.py`)."""
