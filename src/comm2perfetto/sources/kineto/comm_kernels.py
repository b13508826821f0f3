"""Which GPU kernels are communication: one table for every reader (``report``'s overlap, ``merge``'s classes).

A kernel counts as communication when its name matches one row of ``COMM_KERNEL_FAMILIES``; Memcpy/Memset
activities are memory; everything else on a stream is compute. The first three rows are exactly what Holistic
Trace Analysis (HTA, ``hta/utils/utils.py`` ``get_kernel_type``) calls communication; the other rows are
communication HTA counts as compute (``--hta-scope`` in ``report`` uses HTA's rows only, so its figures stay
comparable with HTA's). Names as Kineto writes them, e.g.:

=================  ==========================================================================================
family             kernel names (examples seen in public traces or read from the libraries' sources)
=================  ==========================================================================================
nccl               ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t``
rccl               RCCL keeps NCCL's names: ``ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)`` (MI300)
gloo               ``gloo:all_reduce`` (a CPU annotation; never on a stream in practice)
symmetric memory   torch's ``SymmetricMemory`` ops: ``multimem_all_reduce_kernel`` (B200), ``multimem_one_shot_*``,
                   ``one_shot_all_reduce_kernel``, ``two_shot_all_reduce_kernel``, ``multimem_all_gather_kernel``
nvshmem            ``nvshmem*`` / ``nvshmemi_*`` kernels (NVSHMEM collectives, torch's NVSHMEM extension)
oneccl             Intel oneCCL / torch's XCCL backend on XPU: ``oneccl*``, ``ccl_kernel*``, ``xccl*``
hccl               Habana's HCCL: ``hccl*``
mscclpp            MSCCL++: ``mscclpp*``
=================  ==========================================================================================
"""

from __future__ import annotations

import re

# (family, pattern searched in the kernel name, counted as communication by HTA)
COMM_KERNEL_FAMILIES: tuple[tuple[str, str, bool], ...] = (
    ("nccl", r"^nccl|ncclDevKernel|ncclKernel", True),  # also RCCL: it keeps NCCL's kernel names
    ("gloo", r"gloo:", True),
    ("symmetric memory", r"multimem_|one_shot_all_reduce|two_shot_all_reduce|symm_mem|symmetric_memory", False),
    ("nvshmem", r"nvshmem", False),
    ("oneccl", r"oneccl|\bccl_kernel|xccl", False),
    ("hccl", r"\bhccl", False),
    ("mscclpp", r"mscclpp", False),
)

ALL_COMM_KERNELS = re.compile("|".join(f"(?:{p})" for _, p, _ in COMM_KERNEL_FAMILIES), re.IGNORECASE)
HTA_COMM_KERNELS = re.compile("|".join(f"(?:{p})" for _, p, hta in COMM_KERNEL_FAMILIES if hta))
_FAMILIES = tuple((family, re.compile(p, re.IGNORECASE)) for family, p, _ in COMM_KERNEL_FAMILIES)


def comm_family(name: str) -> str | None:
    """The communication family of a kernel name, or None when it is not communication.

    >>> comm_family("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 8, 16>(...)")
    'symmetric memory'
    >>> comm_family("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"), comm_family("volta_sgemm_128x64")
    ('nccl', None)
    """
    for family, pattern in _FAMILIES:
        if pattern.search(name):
            return family
    return None
