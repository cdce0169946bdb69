"""Measurements run by hand, one command each, outside `make bench`'s registry: too long for it or unlike an
experiment's result.  A fresh clone's `make demo` and `make test` (`make_timings.py`), train.py's exit after
SIGTERM in the middle of a GPT-2-sized step (`stop_time.py`), and each matrix product and operator of a decoding
step (`decode_profile.py`, a Markdown page).  The README quotes their results, in bench/results/."""
