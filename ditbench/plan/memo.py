"""A fast path for repeated fake-tensor operations: the same op on the same metadata, answered from memory.

A step repeats itself (28 blocks of the same shapes; step 2 repeats step 1), and FakeTensorMode's
bookkeeping costs about 0.5 ms an operation. The memo keys an op by its arguments' metadata (and other
arguments' values) and remembers its answer's shape: a fresh tensor, a view of argument i, or argument
i itself. Anything else (resizing, metadata mutation, constants, odd outputs) goes to the fake mode.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
MISS = object()
_UNMEMOIZABLE = object()


def _arg_key(a, mode):
    if type(a) is FakeTensor:
        if a.constant is not None or a.fake_mode is not mode:
            raise _Bypass
        return (a.dtype, a.fake_device, a.shape, a.stride(), a.storage_offset())
    if isinstance(a, _SCALARS):
        return a
    if isinstance(a, (list, tuple)):
        return tuple([_arg_key(x, mode) for x in a])
    raise _Bypass


class _Bypass(Exception):
    pass


_ENTRIES: dict = {}  # shared by every trace of the process: entries hold no tensors, only metadata
_MAX_ENTRIES = 200_000


class DispatchMemo:
    def __init__(self, mode: FakeTensorMode):
        self.mode = mode
        self._templates: dict[torch.device, dict] = {}
        if len(_ENTRIES) > _MAX_ENTRIES:
            _ENTRIES.clear()
        self.entries = _ENTRIES
        self.hits = self.misses = 0

    def key(self, func, args, kwargs):
        """The memo key of a call, or None when the call must go to the fake mode."""
        try:
            kw = _arg_key(tuple(sorted(kwargs.items())), self.mode) if kwargs else ()
            return (func, _arg_key(args, self.mode), kw)
        except _Bypass:
            return None

    def lookup(self, key, args):
        entry = self.entries.get(key, MISS)
        if entry is MISS or entry is _UNMEMOIZABLE:
            return MISS
        self.hits += 1
        if entry is not None and entry[0] == "seq":
            built = [self._build(e, args) for e in entry[2]]
            return built if entry[1] is list else tuple(built)
        return self._build(entry, args)

    def learn(self, key, func, args, out) -> None:
        self.misses += 1
        self.entries[key] = self._entry(func, args, out)

    def _entry(self, func, args, out):
        tags = func.tags
        if torch.Tag.inplace_view in tags or torch.Tag.out in tags or torch.Tag.dynamic_output_shape in tags:
            return _UNMEMOIZABLE
        if isinstance(out, (list, tuple)):
            if not out:
                return _UNMEMOIZABLE
            parts = [self._one(func, args, o) for o in out]
            if any(p is _UNMEMOIZABLE for p in parts):
                return _UNMEMOIZABLE
            fresh = [o.untyped_storage()._cdata for o in out if isinstance(o, FakeTensor)]
            if len(set(fresh)) != len(fresh) and any(p and p[0] == "new" for p in parts):
                return _UNMEMOIZABLE  # outputs sharing one new storage
            return ("seq", type(out), parts)
        return self._one(func, args, out)

    def _one(self, func, args, o):
        if o is None:
            return None
        if not isinstance(o, FakeTensor) or o.is_conj() or o.is_neg() or o.constant is not None:
            return _UNMEMOIZABLE
        for i, a in enumerate(args):
            if o is a:
                return ("arg", i)
        meta = (tuple(o.shape), o.stride(), o.storage_offset(), o.dtype, o.fake_device, o.requires_grad)
        if func.is_view:
            for i, a in enumerate(args):
                if isinstance(a, FakeTensor) and a.untyped_storage()._cdata == o.untyped_storage()._cdata:
                    return ("view", i, *meta)
            return _UNMEMOIZABLE
        if o.storage_offset() != 0 or any(
            isinstance(a, FakeTensor) and a.untyped_storage()._cdata == o.untyped_storage()._cdata
            for a in args
        ):
            return _UNMEMOIZABLE
        with torch._C._DisableTorchDispatch():
            probe = torch.empty_strided(meta[0], meta[1], dtype=meta[3], device="meta")
        if probe.untyped_storage().nbytes() != o.untyped_storage().nbytes():
            return _UNMEMOIZABLE
        return ("new", None, *meta)

    def _build(self, entry, args):
        if entry is None:
            return None
        kind = entry[0]
        if kind == "arg":
            return args[entry[1]]
        _, idx, shape, stride, offset, dtype, device, requires_grad = entry
        with torch._C._DisableTorchDispatch():
            empty = torch.empty_strided(
                shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad
            )
            if kind == "view":
                empty.set_(args[idx].untyped_storage(), offset, shape, stride)
        return self._fake(empty, device)

    def _fake(self, meta: torch.Tensor, device: torch.device) -> FakeTensor:
        """FakeTensor(mode, meta, device) without its argument checking: the same object state, its
        attributes copied from one built the ordinary way (the tests compare the two)."""
        template = self._templates.get(device)
        if template is None:
            with torch._C._DisableTorchDispatch():
                probe = torch.empty(0, device="meta")
            template = self._templates[device] = dict(FakeTensor(self.mode, probe, device).__dict__)
        t = torch.Tensor._make_subclass(
            FakeTensor, meta, meta.requires_grad, dispatch_device=True, device_for_backend_keys=device
        )
        if self.mode._allow_unsafe_data_ptr_access:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(t)
        else:
            torch._C._set_throw_on_mutable_data_ptr(t)
        t.__dict__.update(template)
        return t
