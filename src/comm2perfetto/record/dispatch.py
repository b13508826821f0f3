"""The dispatcher fallback: a kernel on c10d's collective ops for torch without a Flight Recorder for gloo.

Every ProcessGroup collective passes torch's dispatcher as one of c10d's ops (``c10d::allreduce_``,
``c10d::broadcast_`` ...), also the ones DDP and FSDP issue from C++ where no Python patch sees them: DDP's
gradient all-reduces (from its Reducer, in backward), the broadcast of ``_broadcast_coalesced`` and the
parameter shape check's all-gather (in its constructor). ``install()`` registers, with ``torch.library``, a
Python kernel for each op of ``C10D_OPS`` at the ``AutogradCPU`` key: it runs before the backend's kernel for
CPU tensors only (gloo's; NCCL's CUDA tensors never enter Python), does its work and redispatches below
autograd. What the kernel does is not decided here: the installer hands over the kernel factory
(recorder.dispatcher_kernel, put together by session.py), as patch.py is handed its wrapper.

Measured on torch 2.4.1 (benchmarks/bench_record.py ``--only fallback``; docs/performance.md): cheaper than the other
hooks that see these calls. A TorchDispatchMode costs every tensor op, a DDP comm hook covers the gradient
all-reduces alone (and takes the one slot a job may register itself), and wrapping ``ProcessGroup.allreduce``
and friends at the Python binding sees nothing of DDP's (its C++ calls the C++ methods). Tensors created in
``torch.inference_mode()`` have no autograd key and skip the kernel. Installed only where needed (mechanisms.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from comm2perfetto.record.ops import BoundSpec, OpSpec

DISPATCH_KEY = "AutogradCPU"

# c10d op -> how the recorder names and reads it. The public name is the torch.distributed function that issues
# it (what the patch layer would record). ``root_rank`` is a rank of the op's group.
_ROOT = (("root_rank", True),)
C10D_OPS: dict[str, OpSpec] = {
    "allreduce_": OpSpec("all_reduce", ("tensors",)),
    "allreduce_coalesced_": OpSpec("all_reduce_coalesced", ("tensors",)),
    "broadcast_": OpSpec("broadcast", ("tensors",), _ROOT),
    "reduce_": OpSpec("reduce", ("tensors",), _ROOT),
    "allgather_": OpSpec("all_gather", ("input_tensors",)),
    "_allgather_base_": OpSpec("all_gather_into_tensor", ("input_tensor",)),
    "allgather_coalesced_": OpSpec("all_gather_coalesced", ("input_list",)),
    "allgather_into_tensor_coalesced_": OpSpec("all_gather_into_tensor_coalesced", ("inputs",)),
    "gather_": OpSpec("gather", ("input_tensors",), _ROOT),
    "scatter_": OpSpec("scatter", ("input_tensors",), _ROOT),
    "reduce_scatter_": OpSpec("reduce_scatter", ("input_tensors",)),
    "_reduce_scatter_base_": OpSpec("reduce_scatter_tensor", ("input_tensor",)),
    "reduce_scatter_tensor_coalesced_": OpSpec("reduce_scatter_tensor_coalesced", ("inputs",)),
    "alltoall_": OpSpec("all_to_all", ("input_tensors",)),
    "alltoall_base_": OpSpec("all_to_all_single", ("input",)),
    "barrier": OpSpec("barrier"),
}

# The kernel for one op: (the op bound to its schema, the op) -> fn(keyset, *args) that must end by calling
# ``redispatch(keyset, *args)`` (see ``redispatcher``).
KernelFactory = Callable[[BoundSpec, Any], Callable[..., Any]]

_library: Any = None


def bind_op(spec: OpSpec, op: Any) -> BoundSpec:
    """``spec`` resolved against the op's schema, so the kernel reads ``args[i]``. The schema calls the group
    ``process_group``; the bound spec's ``group`` is its position.

    ``c10d::broadcast_(Tensor[] tensors, ProcessGroup process_group, int root_rank, int root_tensor, ...)``:
    inputs ((0, "tensors"),), group 1, peers ((2, "root_rank", True),)
    """
    params = tuple("group" if a.name == "process_group" else a.name for a in op._schema.arguments)
    return BoundSpec(spec, params)


def redispatcher(op: Any) -> Callable[..., Any]:
    """``redispatch(keyset, *args)``: run ``op`` below autograd, where the backend's kernel is."""
    import torch

    after_autograd = torch._C._after_autograd_keyset
    redispatch_boxed = op._handle.redispatch_boxed

    def redispatch(keyset: Any, *args: Any) -> Any:
        return redispatch_boxed(keyset & after_autograd, *args)

    return redispatch


def install(kernel: KernelFactory) -> list[str]:
    """Register ``kernel(bound op, op)`` for each op of ``C10D_OPS`` this torch has. Idempotent. Returns the
    c10d ops it covers."""
    global _library
    import torch

    if _library is not None:
        return sorted(name for name in C10D_OPS if hasattr(torch.ops.c10d, name))
    library = torch.library.Library("c10d", "IMPL")
    covered = []
    for name, spec in C10D_OPS.items():
        packet = getattr(torch.ops.c10d, name, None)
        if packet is None:  # an op this torch does not have
            continue
        op = packet.default
        library.impl(name, kernel(bind_op(spec, op), op), DISPATCH_KEY, with_keyset=True)
        covered.append(name)
    _library = library
    return sorted(covered)


def uninstall() -> None:
    """Take the kernels off again (torch's own kernels run as before). Idempotent."""
    global _library
    library, _library = _library, None
    if library is not None:
        library._destroy()


def installed() -> bool:
    return _library is not None
