"""Memory bandwidth taken from the runtime under test (bench/peers/colocated.py): one thread copying 256 MiB of
float32 into another 256 MiB, without end, so that every weight the runtime reads competes with it for the
memory bus (and the copying thread for a core).

    python -m bench.workloads.memory_stream
"""
import torch

if __name__ == "__main__":
    torch.set_num_threads(1)
    source = torch.ones(2**26)
    target = torch.empty_like(source)
    while True:
        target.copy_(source)
