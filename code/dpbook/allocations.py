"""Memory measured where it is allocated: a census of the tensor storages this process allocates.

``Census`` is a ``TorchDispatchMode``. While it is active, every operator PyTorch dispatches
passes through it, in this thread and in the autograd engine's (which inherits the mode), from
Python or from C++: DDP's ``Reducer`` allocating its buckets (``at::empty`` in
``Reducer::initialize_buckets``), FSDP's AllGather buffers, a backward kernel's gradient. A
storage that an operator returns and that none of its inputs had is an allocation; the census
keeps its size and a weak reference, and forgets it when the storage is freed. Storages resized
in place (``UntypedStorage.resize_``, how FSDP frees and refills its gathered parameters) are
followed too. So ``live_bytes()`` is what the process holds in tensors allocated since the census
began, and ``peak_bytes()`` the most it held at once: not a sum of tensors the caller knows about.

``breakdown`` attributes every live byte, by identity, to one category (``CATEGORIES``):

* ``parameters``, ``gradients``, ``optimizer``: the storages of the model's parameters (a DTensor's
  local shard, an FSDP1 flat parameter), of their ``.grad`` (or tagged as a gradient when
  autograd accumulated it: ``watch``), of the optimizer's state tensors (Adam's one-element step
  counters are bookkeeping: they go to ``other``);
* ``buffers``: communication buffers, storages a collective (an operator of the ``c10d``
  namespace) read or wrote that are none of the above: DDP's buckets, FSDP's AllGather and
  ReduceScatter buffers while they live (and the storages a caller names: ``extra``, such as
  FSDP's gathered parameters, which FSDP copies out of the AllGather's output);
* ``activations``: storages autograd saved for the backward pass (seen by a
  ``saved_tensors_hooks`` pair that the census installs), none of the above;
* ``other``: the rest (temporaries, the batch, leftovers).

What it cannot see: memory allocated outside PyTorch's dispatcher (gloo's own buffers, the CUDA
caching allocator's slack: ``torch.cuda`` statistics measure that on a GPU), and an operator's
scratch space freed before it returns. A storage allocated before the census began is counted
only when it belongs to a category found by identity (a parameter created earlier).

Reading memory right after a gloo collective: call ``measure.settle_collectives()`` first (gloo's
worker thread lets go of the last output a little later).
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("parameters", "gradients", "optimizer", "buffers", "activations", "other")


_DTENSOR: list = []


def _dtensor() -> type:
    if not _DTENSOR:
        from torch.distributed.tensor import DTensor

        _DTENSOR.append(DTensor)
    return _DTENSOR[0]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def storage_of(t: torch.Tensor):
    """The untyped storage behind ``t`` (a DTensor's local shard), or None (meta, sparse)."""
    t = _local(t)
    if t.device.type == "meta" or t.is_sparse:
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _leaves(obj, out: list) -> list:
    """Tensors and storages in ``obj`` (lists, tuples and dicts of them): what an operator's
    arguments and results hold (``tree_flatten`` does the same, ten times slower)."""
    if isinstance(obj, (torch.Tensor, torch.UntypedStorage)):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            _leaves(o, out)
    elif isinstance(obj, dict):
        for o in obj.values():
            _leaves(o, out)
    return out


def _tensors(obj) -> list[torch.Tensor]:
    return [t for t in _leaves(obj, []) if isinstance(t, torch.Tensor)]


def identities(model: torch.nn.Module | None = None,
               optimizer: torch.optim.Optimizer | None = None) -> dict[str, dict]:
    """``{category: {storage key: storage}}`` for the storages ``model`` and ``optimizer`` hold
    now: parameters, gradients and optimizer state (tensors with more than one element)."""
    found: dict[str, dict] = {"parameters": {}, "gradients": {}, "optimizer": {}}

    def add(category, t):
        st = storage_of(t)
        if st is not None and st.nbytes():
            found[category].setdefault(st._cdata, st)

    if model is not None:
        for p in model.parameters():
            add("parameters", p)
            if p.grad is not None:
                add("gradients", p.grad)
    if optimizer is not None:
        for state in optimizer.state.values():
            for t in _tensors(list(state.values())):
                if t.numel() > 1:
                    add("optimizer", t)
    return found


class Census(TorchDispatchMode):
    """``with Census() as census:``: every storage allocated inside the block, live or freed."""

    _active: list["Census"] = []  # entered and not exited, innermost last

    def __init__(self) -> None:
        super().__init__()
        # re-entrant: a garbage collection inside a locked section can free a storage and run
        # its finalizer (``_freed``) in the same thread
        self._lock = threading.RLock()
        self._live: dict[int, tuple[weakref.ref, int]] = {}  # key -> (storage, bytes)
        self._touched: set[int] = set()  # storages a collective read or wrote
        self._grad: set[int] = set()  # storages autograd accumulated a gradient into
        self._saved: set[int] = set()  # storages autograd saved for backward
        self._current = 0
        self._peak = 0
        self._at_peak: tuple = ({}, set(), set(), set())  # live, gradients, touched, saved
        self._peak_due = False
        self._hooks: list = []
        self._resize = None

    # --- the census itself
    @classmethod
    def current(cls) -> "Census | None":
        """The innermost census entered in this process and not exited, or None."""
        return cls._active[-1] if cls._active else None

    def __enter__(self) -> "Census":
        self._resize = torch.UntypedStorage.resize_
        census, original = self, self._resize

        def resize_(st, size):  # not an operator: the dispatcher never sees it
            out = original(st, size)
            census._resized(st)
            return out

        torch.UntypedStorage.resize_ = resize_
        Census._active.append(self)
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saving.__enter__()
        return super().__enter__()

    def _pack(self, t):
        st = storage_of(t) if isinstance(t, torch.Tensor) else None
        if st is not None:
            with self._lock:
                self._saved.add(st._cdata)
        return t

    def __exit__(self, *exc):
        self._saving.__exit__(*exc)
        torch.UntypedStorage.resize_ = self._resize
        Census._active.remove(self)
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, _dtensor()) for t in types):
            return NotImplemented  # let DTensor run its local ops, which come back here
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = set()
        for x in _leaves((args, kwargs), []):
            if isinstance(x, torch.Tensor):
                if (st := storage_of(x)) is not None:
                    inputs.add(st._cdata)
            elif isinstance(x, torch.UntypedStorage):  # set_(storage) returns it
                inputs.add(x._cdata)
        if func.namespace == "c10d":
            with self._lock:
                self._touched |= inputs
        for t in _tensors(out):
            st = storage_of(t)
            if st is not None and st._cdata not in inputs:
                self._allocated(st)
        return out

    def _allocated(self, st) -> None:
        key, size = st._cdata, st.nbytes()
        with self._lock:
            if key in self._live:
                return
            # the weak reference's callback runs when the storage is freed (in whatever thread
            # drops the last reference); it lives in ``_live`` as long as the storage does
            self._live[key] = (weakref.ref(st, lambda _, k=key: self._freed(k)), size)
            self._current += size
            self._mark_peak()

    def _freed(self, key: int) -> None:
        with self._lock:
            if key in self._live:
                self._keep_peak()
            entry = self._live.pop(key, None)
            if entry is not None:
                self._current -= entry[1]
            self._touched.discard(key)
            self._grad.discard(key)
            self._saved.discard(key)

    def _resized(self, st) -> None:
        with self._lock:
            entry = self._live.get(st._cdata)
            if entry is None:
                return
            if st.nbytes() < entry[1]:
                self._keep_peak()
            self._current += st.nbytes() - entry[1]
            self._live[st._cdata] = (entry[0], st.nbytes())
            self._mark_peak()

    def _mark_peak(self) -> None:
        # A new peak only marks the snapshot as due: until something is freed, what is live
        # can only grow, so the state just before the next free is the peak's (one copy per
        # local maximum instead of one per allocation).
        if self._current > self._peak:
            self._peak = self._current
            self._peak_due = True

    def _keep_peak(self) -> None:
        if self._peak_due:
            self._at_peak, self._peak_due = self._now(), False

    def _now(self) -> tuple:
        return dict(self._live), set(self._grad), set(self._touched), set(self._saved)

    # --- what it saw
    def live_bytes(self) -> int:
        """Bytes of the storages allocated inside the census and not freed yet."""
        return self._current

    def peak_bytes(self) -> int:
        """The most ``live_bytes`` has been since the census began or ``reset_peak``."""
        return self._peak

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._current
            self._at_peak, self._peak_due = self._now(), False

    def watch(self, *models: torch.nn.Module) -> None:
        """Tag as a gradient every storage autograd accumulates a parameter's gradient into
        (``register_post_accumulate_grad_hook``): gradients freed by ``zero_grad`` before the
        census is read still count as gradients at the peak. Removed when the census exits."""
        def tag(p):
            if p.grad is not None and (st := storage_of(p.grad)) is not None:
                with self._lock:
                    self._grad.add(st._cdata)

        for model in models:
            for p in model.parameters():
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(tag))

    def breakdown(self, model: torch.nn.Module | None = None,
                  optimizer: torch.optim.Optimizer | None = None, *,
                  at_peak: bool = False, extra: Iterable[torch.Tensor] = ()) -> dict[str, int]:
        """Bytes per category (``CATEGORIES``) of what is live now (or was at the peak): the
        census's allocations, plus the storages of ``model``'s parameters and gradients and of
        ``optimizer``'s state allocated before it began. ``extra``: tensors whose storages are
        communication buffers (FSDP's gathered parameters: the same storage objects are
        resized between steps, so they are known by identity after the run)."""
        known = identities(model, optimizer)
        with self._lock:
            self._keep_peak()  # a peak not followed by any free yet is the state now
            live, grads, touched, saved = self._at_peak if at_peak else self._now()
        touched = touched | {st._cdata for t in extra if (st := storage_of(t)) is not None}
        sizes = {key: size for key, (_, size) in live.items()}
        if not at_peak:  # storages the census did not see allocated but that are state
            for category in ("parameters", "gradients", "optimizer"):
                for key, st in known[category].items():
                    sizes.setdefault(key, st.nbytes())
        out = dict.fromkeys(CATEGORIES, 0)
        for key, size in sizes.items():
            out[_category(key, known, grads, touched, saved)] += size
        return out


def _category(key, known, grads, touched, saved) -> str:
    if key in known["parameters"]:
        return "parameters"
    if key in known["gradients"] or key in grads:
        return "gradients"
    if key in known["optimizer"]:
        return "optimizer"
    if key in touched:
        return "buffers"
    return "activations" if key in saved else "other"


def census_of(objects: Iterable) -> int:
    """Bytes of the distinct storages behind ``objects`` (tensors), each storage once."""
    seen = {}
    for t in objects:
        st = storage_of(t)
        if st is not None:
            seen.setdefault(st._cdata, st.nbytes())
    return sum(seen.values())
