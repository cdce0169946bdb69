"""The runtimes we compare ourselves with, and how the comparison runs them: ONNX Runtime and llama.cpp set up
as their own docs advise (`onnx_peer.py`, `llama_cpp_peer.py`; their environment by `setup.sh`), each decoding
runtime in a process of its own (`decode_sides.py`), and another program's load on the machine
(`colocated.py`).  bench/experiments/generate_speed.py and serve_speed.py use them."""
