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
deepep             DeepEP's expert-parallel all-to-all (``deep_ep::``, DeepSeek's internal build ``dpsk::ep::``):
                   ``intranode``/``internode``/``internode_ll`` ``notify_dispatch``, ``cached_notify_dispatch``,
                   ``dispatch``, ``cached_notify``, ``cached_notify_combine``, ``combine``, ``barrier``
                   (``void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, ...)`` in DeepSeek's public
                   training profile); not ``layout::get_dispatch_layout``, which counts tokens on the GPU alone
pplx               pplx-kernels' NVSHMEM all-to-all, where the kernel's name keeps the ``pplx::`` namespace
=================  ==========================================================================================

A family whose kernels do one operation says which (``family_op``): DeepEP's and pplx-kernels' dispatch and
combine exchange tokens between every pair of ranks of the expert-parallel group, an all-to-all. Their kernels
carry no sizes and name no process group (no ``record_param_comms`` launches them), so a trace tells their time
and nothing of who sent what to whom. pplx-kernels' all-to-all kernels live in an anonymous namespace
(``(anonymous namespace)::dispatchKernel<10u, true, false>``, read from its sources): a name no other library
could also have is all a table like this can go by, so those are compute here until a trace names them.
"""

from __future__ import annotations

import re

# (family, pattern searched in the kernel name, counted as communication by HTA, the operation every kernel of
# the family performs: None where the name or the CPU op that launched it must say)
COMM_KERNEL_FAMILIES: tuple[tuple[str, str, bool, str | None], ...] = (
    ("nccl", r"^nccl|ncclDevKernel|ncclKernel", True, None),  # also RCCL: it keeps NCCL's kernel names
    ("gloo", r"gloo:", True, None),
    ("symmetric memory", r"multimem_|one_shot_all_reduce|two_shot_all_reduce|symm_mem|symmetric_memory", False,
     None),
    ("nvshmem", r"nvshmem", False, None),
    ("oneccl", r"oneccl|\bccl_kernel|xccl", False, None),
    ("hccl", r"\bhccl", False, None),
    ("mscclpp", r"mscclpp", False, None),
    ("deepep", r"(?:\bdeep_ep|\bdpsk::ep)::(?:intranode|internode(?:_ll)?)::(?:notify_dispatch|cached_notify_dispatch"
               r"|cached_notify_combine|cached_notify|dispatch(?:_pcie)?|combine|barrier)\b", False, "all_to_all"),
    ("pplx", r"\bpplx::", False, "all_to_all"),
)

ALL_COMM_KERNELS = re.compile("|".join(f"(?:{p})" for _, p, _, _ in COMM_KERNEL_FAMILIES), re.IGNORECASE)
HTA_COMM_KERNELS = re.compile("|".join(f"(?:{p})" for _, p, hta, _ in COMM_KERNEL_FAMILIES if hta))
_FAMILIES = tuple((family, re.compile(p, re.IGNORECASE)) for family, p, _, _ in COMM_KERNEL_FAMILIES)
_OPS = {family: op for family, _, _, op in COMM_KERNEL_FAMILIES}


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


def family_op(family: str | None) -> str | None:
    """The operation every kernel of a communication family performs (``all_to_all`` for DeepEP's), None where
    the family's kernels do several (NCCL's: the kernel's name or the CPU op that launched it says which).

    >>> family_op(comm_family("void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*)"))
    'all_to_all'
    >>> family_op("nccl"), comm_family("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)")
    (None, None)
    """
    return _OPS.get(family) if family is not None else None
