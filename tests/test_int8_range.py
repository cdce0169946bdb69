"""Int8Linear's activations: 8 bits where the CPU's int8 kernel sums them exactly, 7 where it could overflow.
fbgemm is told which instructions to use through an environment variable read when it loads, so each case runs
in a process of its own."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.source_tree import ROOT

PROBE = textwrap.dedent("""
    import json, warnings
    warnings.filterwarnings("ignore")
    import torch
    from model.int8 import Int8Linear, dynamic_product, full_range_activations, quantize_per_channel
    weight = torch.ones(8, 64)
    layer = Int8Linear(*quantize_per_channel(weight), None)
    x = torch.ones(1, 64)
    x[0, 0] = -1.0  # activations at the top of their range against weights of 127: an int16 pair sum overflows
    out = layer(x)
    print(json.dumps({
        "full_range": full_range_activations(),
        "error": float((out - x @ weight.t()).abs().max()),
        "as_8_bit": bool(torch.equal(out, dynamic_product(x, layer._packed, reduce_range=False))),
        "as_7_bit": bool(torch.equal(out, dynamic_product(x, layer._packed, reduce_range=True))),
        "8_bit_error": float((dynamic_product(x, layer._packed, reduce_range=False) - x @ weight.t()).abs().max()),
    }))
""")


def probe(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_kernel_that_would_overflow_8_bit_activations_gets_7_bit_ones():
    seen = probe({"FBGEMM_ENABLE_INSTRUCTIONS": "AVX2"})  # AVX2's int16 pair sums, as on a CPU without VNNI
    assert seen["8_bit_error"] > 10  # the hazard is real there: saturated pairs
    assert not seen["full_range"] and seen["as_7_bit"]
    assert seen["error"] < 0.5  # 7-bit rounding of 64 activations, no overflow


def test_the_layer_uses_8_bit_activations_exactly_where_the_host_s_kernel_sums_them_exactly():
    seen = probe({})
    assert seen["full_range"] == (seen["8_bit_error"] < 1.0)
    assert seen["as_8_bit"] if seen["full_range"] else seen["as_7_bit"]
    assert seen["error"] <= (0.25 if seen["full_range"] else 0.5) + 1e-3


@pytest.mark.skipif(not (Path("/proc/cpuinfo").exists() and "avx512_vnni" in Path("/proc/cpuinfo").read_text()),
                    reason="not a Linux CPU with AVX-512 VNNI")
def test_a_vnni_cpu_gets_8_bit_activations():
    assert probe({})["full_range"]
