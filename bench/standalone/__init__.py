"""Measurements run by hand, one command each, outside `make bench`'s registry: too long for it or unlike an
experiment's result.  A fresh clone's `make demo` and `make test` (`make_timings.py`), train.py's exit after
SIGTERM in the middle of a GPT-2-sized step (`stop_time.py`), each matrix product and operator of a decoding
step (`decode_profile.py`, a Markdown page), and the CPU the server's event loop and engine thread spend per
streamed token (`serve_cpu_split.py`, with `serve_cpu_side.py`, which it runs per side), and a greedy step's
token choice, numpy's argmax against torch's (`greedy_argmax.py`).  The README quotes their results, in bench/results/."""
