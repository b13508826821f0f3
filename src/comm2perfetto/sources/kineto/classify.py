"""What a Kineto event is, from its name, category and thread alone: communication or not, CPU or GPU work, the
class of a GPU kernel (compute, communication, memory) and whether a CPU thread trains. No parsing here: the
parsers (``parse``, ``spans``) ask once per distinct name, category or thread and cache the answer.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from comm2perfetto.sources.kineto.comm_kernels import ALL_COMM_KERNELS, HTA_COMM_KERNELS

__all__ = [
    "BACKEND_ANNOTATION", "COMM_NAME", "CPU_COMPUTE_KINDS", "CPU_KINDS", "CPU_KIND_SUFFIXES", "GPU_ANNOTATION_KIND",
    "GPU_WORK_KINDS", "PROFILER_STEP", "classify_gpu", "cpu_class", "is_training_thread", "normalise_kind",
]

# A communication event, on any thread or stream: the calling thread's c10d op, a backend's annotation, the
# profiler's record_param_comms, or a communication kernel.
COMM_NAME = re.compile(r"^(nccl|gloo|c10d::|_?c10d_functional::|record_param_comms)|"
                       + ALL_COMM_KERNELS.pattern, re.IGNORECASE)

# GPU kernel classes: comm = the kernels of sources/kineto/comm_kernels.py's table (NCCL, RCCL, symmetric memory,
# NVSHMEM, oneCCL ...; with hta=True only the rows Holistic Trace Analysis counts), memory = Memcpy*/Memset*
# activities, all else on a stream is compute.
_GPU_MEMORY_NAME = re.compile(r"Memcpy|Memset")

# Kineto categories ("cat"), normalised: current names as libkineto's ActivityType.cpp spells them, plus the
# capitalised names of early Kineto releases ("Operator", "Kernel", "Runtime", "Memcpy", "Memset").
_KIND_ALIASES = {
    "operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
}
GPU_WORK_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GPU_ANNOTATION_KIND = "gpu_user_annotation"
CPU_KINDS = frozenset({"cpu_op", "user_annotation", "python_function", "hpu_op"})
CPU_KIND_SUFFIXES = ("_runtime", "_driver")  # cuda_runtime, cuda_driver, xpu_runtime, privateuse1_driver ...
# The CPU events that can be compute: not python_function (frames wrap everything), not runtime calls.
CPU_COMPUTE_KINDS = frozenset({"cpu_op", "user_annotation"})

# Comm library worker threads that show up in a trace: gloo runs each collective on its own worker thread
# ("thread 5433 (pt_gloo_runloop)", seen on torch 2.13), NCCL's watchdog/heartbeat threads are pt_nccl_*.
_WORKER_THREAD_NAME = re.compile(r"gloo|nccl", re.IGNORECASE)
# What such a worker records: the backend's own annotation of the collective it runs ("gloo:all_reduce").
BACKEND_ANNOTATION = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")


@functools.lru_cache(maxsize=1 << 16)  # a trace has millions of CPU ops but a few thousand names
def cpu_class(kind: str, name: str) -> str | None:
    """What a training thread's CPU event is to the ``cpu`` basis of ``report`` (and the trace's ``class``):
    ``"comm"`` for a communication op (``record_param_comms``, ``c10d::allreduce_``, the backend's own
    ``gloo:all_reduce`` or ``nccl:all_reduce``), ``"compute"`` for any other operator or user annotation, None for
    what only wraps work (``ProfilerStep#n``, Python frames, runtime and driver calls).

    >>> cpu_class("cpu_op", "aten::mm"), cpu_class("cpu_op", "record_param_comms"), cpu_class("python_function",
    ...     "train.py(12): step"), cpu_class("user_annotation", "ProfilerStep#3")
    ('compute', 'comm', None, None)
    """
    if COMM_NAME.search(name):
        return "comm"
    if kind in CPU_COMPUTE_KINDS and not PROFILER_STEP.match(name):
        return "compute"
    return None


def normalise_kind(category: str) -> str:
    """Kineto's ``cat`` in today's spelling: ``"Kernel"`` -> ``"kernel"``, ``"Memcpy"`` -> ``"gpu_memcpy"``,
    ``"Runtime"`` -> ``"cuda_runtime"``, ``"cpu_op"`` -> ``"cpu_op"``."""
    kind = category.strip().lower()
    return _KIND_ALIASES.get(kind, kind)


def classify_gpu(name: str, category: str, hta: bool = False) -> str:
    """``"comm"``, ``"memory"`` or ``"compute"`` for a GPU event (``hta``: HTA's communication kernels only).

    >>> classify_gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel")
    'comm'
    >>> classify_gpu("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy")
    'memory'
    >>> classify_gpu("void at::native::vectorized_elementwise_kernel<4, ...>", "kernel")
    'compute'
    """
    if normalise_kind(category) in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if (HTA_COMM_KERNELS if hta else ALL_COMM_KERNELS).search(name):
        return "comm"
    if _GPU_MEMORY_NAME.search(name):
        return "memory"
    return "compute"


def is_training_thread(pid: int, tid: int, *, has_steps: bool, names: Sequence[str],
                       only_backend_annotations: bool) -> bool:
    """Whether the CPU thread ``tid`` of process ``pid`` is a training thread, whose events go to ``cpu_ops``.

    - Never tid 0: not a thread at all. With ``with_stack=True`` the stacks of Python threads other than the
      profiled one come with tid 0 (seen on torch 2.13: comm2perfetto's own watchdog thread,
      ``threading.py(1002): _bootstrap`` ...); several threads would share that row, and their slices could
      not nest.
    - Always the process's main thread (tid == pid on Linux), where the Python training loop runs, and any
      thread with a ``ProfilerStep#n`` annotation (the thread that calls ``prof.step()``).
    - Any other thread too (autograd's device threads ``pt_autograd_<n>`` run the backward pass of GPU jobs; a
      pin-memory thread copies batches), unless it is a communication library's worker: a thread Kineto names
      after gloo or NCCL (``thread 5433 (pt_gloo_runloop)``), or one whose every event is a backend's own
      annotation (``gloo:all_reduce``). The second test is needed because Kineto may name a gloo worker
      ``(python)`` first and ``(pt_gloo_runloop)`` after it (seen), or not at all. Workers' collectives stay in
      ``comm_events``.

    >>> is_training_thread(5370, 5433, has_steps=False, names=["thread 5433 (pt_gloo_runloop)"],
    ...                    only_backend_annotations=True)
    False
    """
    if tid <= 0:
        return False
    if tid == pid or has_steps:
        return True
    worker = only_backend_annotations or any(_WORKER_THREAD_NAME.search(n) for n in names)
    return not worker
