"""The one place that chooses the device, the distributed backend and the precision policy."""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass

import torch

from runtime.errors import UserError


class DeviceError(UserError, ValueError):
    """A device or precision this machine cannot provide."""


def choose_device(requested: str = "auto") -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as e:
        raise DeviceError(f"--device {requested!r} is not a device; use auto, cpu, cuda or cuda:N") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"--device {requested} requested but CUDA is not available; use --device cpu")
    return device


def distributed_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass(frozen=True)
class Precision:
    """Autocast dtype (None = fp32 throughout) and whether fp16 needs a gradient scaler."""
    device_type: str
    autocast_dtype: torch.dtype | None

    @property
    def needs_grad_scaler(self) -> bool:
        return self.autocast_dtype == torch.float16

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)


def precision_policy(device: torch.device, requested: str = "auto") -> Precision:
    """fp32 on CPU, where bf16 autocast gains little and, on CPUs without bf16 units, costs much (`python -m
    bench.experiments precision_memory`, bench/results/precision_memory.json: each row's time_vs_fp32); bf16
    autocast on CUDA when supported, else fp16."""
    if requested == "auto":
        if device.type != "cuda":
            requested = "fp32"
        else:
            requested = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    dtypes = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
    if requested not in dtypes:
        raise DeviceError(f"unknown precision {requested!r}; choose auto, fp32, bf16 or fp16")
    if requested == "fp16" and device.type != "cuda":
        raise DeviceError("fp16 autocast is only supported on CUDA here; use --precision fp32 on CPU")
    return Precision(device.type, dtypes[requested])


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA allocator peak, or the process's peak resident set size on CPU.

    On Linux this is VmHWM, the peak of this process's own memory: ru_maxrss would carry over the
    peak of the parent it was forked from (Linux keeps it across exec), so a train.py started by a
    large process -- torchrun, a benchmark -- would report its parent's size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):  # not Linux
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_memory(device: torch.device) -> None:
    """After an out-of-memory error: drop the failed step's tensors before going on."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA raises torch.OutOfMemoryError; the CPU allocator raises a plain RuntimeError saying so."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))
