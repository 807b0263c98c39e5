"""Where a run's tensors live and in what precision it computes: parsed once, applied here.

Why this module exists: `--device` and `--precision` are read by the CLI once
(`resolve_device`, `gnnc.plan.precision.check_precision`) and travel down as
plain strings in `TrainConfig` (one process) or `DistJob`/`DistConfig` (every
rank). Everything that acts on them is here: the torch device of a rank
(`rank_device`: GPU `local_rank` under `--nproc` and torchrun), how a host
tensor reaches it (`mover`: pinned host memory, then one asynchronous copy, on
CUDA; nothing at all on CPU, so a CPU run stays exactly what it was), the
autocast region of a training step and the loss scaler of fp16.

`--device cuda` on a machine without a usable GPU is bad input (exit 2, one
line); `auto` takes CUDA when torch sees a GPU.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ContextManager, Protocol, TypeVar

import torch

from gnnc.errors import GnncError
from gnnc.plan.precision import DEFAULT_PRECISION, check_precision

DEVICES = ("cpu", "cuda", "auto")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class DeviceError(GnncError):
    """The device or precision asked for cannot run on this machine (bad input: exit 2)."""


def cuda_unavailable() -> str | None:
    """Why this process cannot use a GPU, or None when it can."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def resolve_device(spec: str, here: bool = True) -> str:
    """`cpu`, `cuda` or `auto` -> `cpu` or `cuda`; `auto` is `cuda` when a GPU is present.

    `here`: the device must be on this machine (a run, a probe), so `cuda` without a usable GPU is a
    DeviceError; a compile for a GPU elsewhere passes False.
    """
    if spec not in DEVICES:
        raise DeviceError(f"unknown device '{spec}' (known: {', '.join(DEVICES)})")
    if spec == "auto":
        return "cuda" if cuda_unavailable() is None else "cpu"
    if spec == "cuda" and here:
        why = cuda_unavailable()
        if why is not None:
            raise DeviceError(f"--device cuda: no CUDA device ({why}); use --device cpu or auto")
    return spec


def check_gpu_count(nproc: int) -> None:
    """`--nproc N` on CUDA gives each rank its own GPU (its local rank): there must be N of them."""
    count = torch.cuda.device_count()
    if nproc > count:
        raise DeviceError(f"--nproc {nproc} on CUDA needs {nproc} GPUs (one per rank); this machine has {count}")


def rank_device(device: str, local_rank: int = 0) -> torch.device:
    """The torch device of one process: GPU `local_rank` on CUDA, else the named device."""
    if device == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(device)


def start_rank(device: str, precision: str, local_rank: int, given: torch.device | None = None) -> torch.device:
    """What every rank process does first: its allocator set up (gnnc.runtime.memory), one
    thread (the ranks share the cores), and its device (`given`, or GPU `local_rank` on CUDA) checked for
    `precision`."""
    from gnnc.runtime.memory import set_up_allocator  # deferred: ctypes and libc only when a rank starts

    set_up_allocator()
    torch.set_num_threads(1)
    placed = rank_device(device, local_rank) if given is None else given
    check_precision_on(placed, precision)
    return placed


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype products run in (and activations are exchanged in) at `precision`."""
    return _DTYPES[check_precision(precision)]


def check_precision_on(device: torch.device, precision: str) -> None:
    """Refuse, before anything runs, a precision this device cannot train in."""
    check_precision(precision)
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"--precision bf16: GPU {torch.cuda.get_device_name(device)} has no bfloat16 support; "
                          "use fp16 or fp32")


def autocast(device: torch.device, precision: str) -> ContextManager[object]:
    """The region a forward pass runs in: nothing at fp32, torch.autocast to the 16-bit type otherwise."""
    if precision == DEFAULT_PRECISION:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=compute_dtype(precision))


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler | None:
    """fp16's loss scaler (its gradients underflow unscaled); None at fp32 and bf16."""
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


class HasTensors(Protocol):
    def map_tensors(self: T, fn: Callable[[torch.Tensor], torch.Tensor]) -> T: ...


T = TypeVar("T", bound=HasTensors)


def place(obj: T, device: torch.device) -> T:
    """A graph structure (CSR, GraphView, LocalGraph, ...) with every tensor on `device`, copied once (`mover`);
    on CPU the object itself, untouched (its caches, shared with the graph it came from, stay where they are)."""
    return obj if device.type == "cpu" else obj.map_tensors(mover(device))


def mover(device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a host tensor reaches `device`: unchanged on CPU; on CUDA through pinned memory, copied once.

    The copy is asynchronous (non_blocking from pinned memory): a shard's tensors
    stream to the GPU while the next is pinned, and the first kernel that reads
    them is ordered after the copy on the same stream.
    """
    if device.type == "cpu":
        return lambda t: t
    if device.type == "cuda":
        def to_cuda(t: torch.Tensor) -> torch.Tensor:
            if t.device.type != "cpu":
                return t.to(device)
            host = t.pin_memory() if t.layout == torch.strided else t
            return host.to(device, non_blocking=t.layout == torch.strided)
        return to_cuda
    return lambda t: t.to(device)  # another device (the test suite's stand-in for a GPU)
