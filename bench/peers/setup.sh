#!/usr/bin/env bash
# The peers' own environment, apart from the project's .venv: ONNX Runtime (with the transformers its GPT-2
# converter works with), llama-cpp-python and gguf, and llama.cpp's llama-server built from the llama.cpp that
# llama-cpp-python's sdist vendors.  About 20 minutes on 2 cores, most of it compiling llama.cpp twice.
#
#     bash bench/peers/setup.sh            # after `make setup`; writes .peers/
#     .peers/venv/bin/python -m bench.experiments generate_speed
#     .peers/venv/bin/python -m bench.experiments serve_speed --llama-server .peers/llama-server
#
# .peers/venv sees the project's packages through a .pth file pointing at .venv's site-packages, so the
# benchmark runs our code beside the peers with the project's own pinned torch; its own packages come first.
set -euo pipefail
cd "$(dirname "$0")/../.."
PEERS=.peers
LLAMA_CPP_PYTHON=0.3.36
test -x .venv/bin/python || { echo "error: no .venv here; run 'make setup' first" >&2; exit 1; }
mkdir -p "$PEERS"
test -x "$PEERS/venv/bin/python" || python3 -m venv "$PEERS/venv"
# A Python's site-packages, as its own `python -m sysconfig` reports it.
site_packages() { "$1" -m sysconfig | sed -n 's/^\tpurelib = "\(.*\)"$/\1/p'; }
site=$(site_packages "$PEERS/venv/bin/python")
test -d "$site" || { echo "error: $PEERS/venv's python names no site-packages folder" >&2; exit 1; }
site_packages .venv/bin/python > "$site/project.pth"
# torch and numpy as the project pins them, never replaced by a peer's requirement.
.venv/bin/pip freeze | grep -E '^(torch|numpy)==' > "$PEERS/constraints.txt"
# transformers 4.44: ONNX Runtime's GPT-2 converter hands the model a tuple cache, which transformers 5 refuses.
"$PEERS/venv/bin/pip" install -c "$PEERS/constraints.txt" onnxruntime==1.32.0 onnx gguf "transformers==4.44.2"
CMAKE_ARGS="-DGGML_NATIVE=ON" "$PEERS/venv/bin/pip" install -c "$PEERS/constraints.txt" \
    "llama-cpp-python==$LLAMA_CPP_PYTHON"
if ! test -x "$PEERS/llama-server"; then
    "$PEERS/venv/bin/pip" download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$PEERS"
    tar -xzf "$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$PEERS"
    source="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp"
    cmake -S "$source" -B "$source/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build "$source/build" --target llama-server -j "$(nproc)"
    ln -sf "$PWD/$source/build/bin/llama-server" "$PEERS/llama-server"
fi
"$PEERS/llama-server" --version
