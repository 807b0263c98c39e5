"""A stand-in for a GPU on a machine without one: tensors that say they live on another device, and a
record of every op that mixes devices or reads a device tensor on the host.

Why not torch's own fakes (tried with torch 2.13, CPU build): `FakeTensorMode` with a fake CUDA device
cannot index by a boolean mask (a data-dependent size), has no sparse CSR tensors ("Torch not compiled with
CUDA enabled"), and its backward aborts the process: autograd's engine asks for CUDA's device guard, which a
CPU build does not have. Meta tensors have no values, so boolean masks, sparse CSR products
("aten::addmm.out ... 'SparseCsrMeta' backend") and every data-dependent size fail there too.

So the stand-in keeps real CPU data and only *labels* it: an `OnDevice` tensor wraps a CPU tensor and
reports `device == meta`, a device type autograd treats like the CPU (so backward runs) and that no real
tensor of a run is on. The code under test is handed `torch.device("meta")` as its device and takes the
same branches it takes for CUDA (everything that is not the CPU), so everything it places goes through
`.to(device)`, every tensor it creates "on the device" is made where it says. A dispatch mode
(`StandinDevice`) runs each op on the wrapped CPU data and wraps the result, and records:

`torch.tensor(data, device=...)` and `t.new_tensor(data)` build their tensors below the dispatcher; the
stand-in makes them on the host and copies them over, as CUDA does.

* `mix`: an op whose tensors sit on both sides (0-dim CPU tensors excepted: torch allows them beside CUDA
  tensors as scalars); on a GPU these raise "Expected all tensors to be on the same device";
* while `watch()` is on (the epoch loop): `read` (`.item()`, `bool()`, `int()`, `float()`, `.tolist()`,
  `.cpu()`, `.numpy()`, `.to('cpu')` of a device tensor: the host waits for the GPU), `sync` (ops whose
  result size depends on device values: boolean-mask indexing, `nonzero`, `unique`, `repeat_interleave`
  without `output_size`, ...), `upload` (a host tensor with more than one element copied to the device:
  something was not placed before the loop) and `collective` (a torch.distributed op given host tensors,
  which NCCL refuses).

Sparse tensors cannot be wrapped (torch 2.13: "layout_impl is only implemented for TensorImpl
subclasses"); a sparse tensor made from device tensors is kept as it is and remembered as being on the
device.
"""
from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary

STANDIN = torch.device("meta")

aten = torch.ops.aten
_TRANSFERS = (aten._to_copy.default, aten.copy_.default, aten.lift_fresh.default, aten.lift_fresh_copy.default)
_DATA_DEPENDENT = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
_HOST_READ_METHODS = {torch.Tensor.item: "item", torch.Tensor.__bool__: "bool", torch.Tensor.__int__: "int",
                      torch.Tensor.__float__: "float", torch.Tensor.__index__: "index", torch.Tensor.tolist: "tolist",
                      torch.Tensor.numpy: "numpy", torch.Tensor.cpu: "cpu"}


class OnDevice(torch.Tensor):
    """A CPU tensor labelled as living on the stand-in device (see the module docstring)."""

    inner: torch.Tensor
    # no subclass handling at the Python level: results stay what the dispatch mode makes them
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> "OnDevice":
        out = torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                  storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                  device=STANDIN, requires_grad=inner.requires_grad)
        out.inner = inner
        return out

    def __repr__(self, **kwargs: Any) -> str:
        return f"OnDevice({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a stand-in device tensor outside StandinDevice")


@dataclass(frozen=True)
class Event:
    kind: str  # mix, read, sync, upload, collective
    op: str
    where: str  # the innermost frame of gnnc's own code that issued it: file:line (code)
    function: str  # that frame's function

    def __str__(self) -> str:
        return f"{self.kind}: {self.op} in {self.function}, {self.where}"


def _caller() -> tuple[str, str]:
    frames = [f for f in traceback.extract_stack()[:-3]
              if any(part in f.filename for part in ("/runtime/", "/compiler/", "/passes/"))
              and "site-packages" not in f.filename]
    if not frames:
        return "?", "?"
    f = frames[-1]
    return f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} ({f.line})", f.name


class StandinDevice:
    """`with StandinDevice() as sd:` runs torch with the stand-in device; `with sd.watch():` marks the loop."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.watching = False
        self._sparse = WeakIdKeyDictionary()
        self._stack = contextlib.ExitStack()

    # --- the two modes ---------------------------------------------------------------------------------

    def __enter__(self) -> "StandinDevice":
        # A wrapper that is a view of a sparse tensor (`values()`) is viewed again by replaying the view ops on
        # the base; autograd's default, as_strided on the base, fails ("Sparse CSR tensors do not have strides").
        replay = torch._C._is_view_replay_enabled()
        torch._C._set_view_replay_enabled(True)
        self._stack.callback(torch._C._set_view_replay_enabled, replay)
        self._stack.enter_context(_Functions(self))
        self._stack.enter_context(_Dispatch(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Record host reads, data-dependent sizes, uploads and host collectives inside this block."""
        self.watching = True
        try:
            yield
        finally:
            self.watching = False

    def note(self, kind: str, op: str) -> None:
        if kind == "mix" or self.watching:
            self.events.append(Event(kind, op, *_caller()))

    def on_device(self, t: Any) -> bool:
        return isinstance(t, OnDevice) or (isinstance(t, torch.Tensor) and t.layout != torch.strided
                                          and t in self._sparse)

    def mark(self, t: Any) -> Any:
        """A result of an op on the device: wrapped (dense) or remembered (sparse)."""
        if not isinstance(t, torch.Tensor) or isinstance(t, OnDevice):
            return t
        if t.layout != torch.strided:
            self._sparse[t] = True
            return t
        return OnDevice(t)

    # --- helpers for tests --------------------------------------------------------------------------------

    def host(self, t: torch.Tensor) -> torch.Tensor:
        """The CPU data behind `t` (without recording a read: for the test's own checks)."""
        return t.inner if isinstance(t, OnDevice) else t

    def problems(self, kinds: tuple[str, ...] = ("mix", "read", "sync", "upload", "collective")) -> list[str]:
        return [str(e) for e in self.events if e.kind in kinds]


class _Functions(TorchFunctionMode):
    """Python-level calls: `torch.tensor(..., device=standin)` (made on the host, then copied) and host reads."""

    def __init__(self, sd: StandinDevice):
        super().__init__()
        self.sd = sd

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and _is_standin(kwargs.get("device")):
            device = kwargs.pop("device")
            return func(*args, **kwargs).to(device)
        if func is torch.Tensor.new_tensor and self.sd.on_device(args[0]):  # like torch.tensor on its device
            kwargs.setdefault("dtype", args[0].dtype)
            return torch.tensor(*args[1:], **kwargs).to(STANDIN)
        name = _HOST_READ_METHODS.get(func)
        if name is not None and args and self.sd.on_device(args[0]):
            self.sd.note("read", f"Tensor.{name}()")
            if name == "numpy":  # what CUDA does too
                raise TypeError("can't convert a device tensor to numpy: copy it to the host first")
            if name == "tolist":  # torch has no tolist for tensor subclasses: read the data behind it
                return self.sd.host(args[0]).tolist()
        return func(*args, **kwargs)


def _is_standin(device: Any) -> bool:
    return device is not None and torch.device(device).type == STANDIN.type


class _Dispatch(TorchDispatchMode):
    def __init__(self, sd: StandinDevice):
        super().__init__()
        self.sd = sd

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        sd = self.sd
        kwargs = dict(kwargs or {})
        sides: set[str] = set()
        host_big = False  # a host tensor of more than one element (a scalar's upload is no placement miss)

        def unwrap(t: Any) -> Any:
            nonlocal host_big
            if sd.on_device(t):
                sides.add("device")
                return t.inner if isinstance(t, OnDevice) else t
            if isinstance(t, torch.Tensor):
                if t.device.type == STANDIN.type:
                    raise AssertionError(f"{func}: a tensor on the real meta device (no values) reached the stand-in")
                if t.dim() > 0 or t.layout != torch.strided:
                    sides.add("host")
                    host_big = host_big or t.numel() > 1 or t.layout != torch.strided
            return t

        a, k = tree_map(unwrap, args), tree_map(unwrap, kwargs)
        to_device = _is_standin(k.get("device"))
        if to_device:
            k["device"] = torch.device("cpu")
        name = str(func)
        if func in _TRANSFERS:
            if func is aten._to_copy.default and "device" in kwargs:
                if "device" in sides and not to_device:
                    sd.note("read", f"{name} to {kwargs['device']}")
                elif to_device and host_big:
                    sd.note("upload", name)
        elif func.namespace == "c10d":
            if "host" in sides:
                sd.note("collective", name)
        elif len(sides) > 1:
            sd.note("mix", name)
        if "device" in sides and _syncs(func, a, k):
            sd.note("sync", name)
        out = func(*a, **k)
        moved_off = func is aten._to_copy.default and "device" in kwargs and not to_device
        if to_device or ("device" in sides and not moved_off):
            out = tree_map(sd.mark, out)
        return out


def _syncs(func, args: tuple, kwargs: dict) -> bool:
    """Whether `func` must read device values on the host (to size its result, or to return a Python value)."""
    if func in (aten.equal.default, aten.allclose.default):
        return True
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if func is aten.one_hot.default:
        return (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) < 0
    return any(tag in func.tags for tag in _DATA_DEPENDENT)
