"""All-to-all beyond NCCL: the kernels of expert-parallel libraries (DeepEP's dispatch and combine), which name no
process group and carry no sizes, count as communication and as all-to-all, never as a guessed group or size.

The kernel names are DeepEP's as its sources and DeepSeek's public training profile
(github:deepseek-ai/profile-data ``train.json``, one H800 rank of an EP64 job) write them."""

from __future__ import annotations

import json

import pytest

from comm2perfetto.sources.kineto.classify import classify_gpu
from comm2perfetto.sources.kineto.collectives import op_name
from comm2perfetto.sources.kineto.comm_kernels import HTA_COMM_KERNELS, comm_family
from support.cli import run_cli
from support.kineto_fixtures import KinetoDoc

DISPATCH = "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, int*, long*, float*, int*)"
COMBINE = "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, int const*)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"


@pytest.mark.parametrize(("name", "family"), [
    (DISPATCH, "deepep"), (COMBINE, "deepep"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*)", "deepep"),
    ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int, int, int**, int)", "deepep"),
    ("void deep_ep::internode_ll::dispatch<false, 3, 7168>(void*, float*, int*, long*)", "deepep"),
    ("void deep_ep::internode::cached_notify<8, 4>(int, int, int, int, int*, int*, int*, int, int)", "deepep"),
    # counts tokens per expert on this GPU alone: compute, though it is DeepEP's
    ("void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)", None),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", None),
    ("void pplx::internode::dispatchKernel<10u, true, false>(int*)", "pplx"),
    ("void my_dispatch_kernel<8>(int*)", None),  # a dispatch of no known library is no communication
])
def test_expert_parallel_kernel_families(name, family):
    assert comm_family(name) == family
    assert classify_gpu(name, "kernel") == ("comm" if family else "compute")
    assert op_name(None, name) == ("all_to_all" if family else "collective")
    assert not HTA_COMM_KERNELS.search(name)  # HTA counts NCCL's only: --hta-scope is unchanged


def _rank_trace(rank: int) -> KinetoDoc:
    """One rank of a 2-rank job that twice overlaps a GEMM with a dispatch then a combine (no NCCL at all):
    from each t0, compute 0-100 us, dispatch 20-60 us (rank 1: 25-65), combine 90-130 us."""
    doc = KinetoDoc(rank=rank)
    for t0 in (0.0, 1000.0):
        doc.gpu(7, GEMM, t0, 100.0)
        doc.gpu(20, DISPATCH, t0 + 20 + 5 * rank, 40.0)
        doc.gpu(20, COMBINE, t0 + 90, 40.0)
    return doc


def test_deepep_kernels_are_the_jobs_all_to_all(tmp_path):
    for rank in range(2):
        _rank_trace(rank).write(tmp_path / f"rank{rank}.json")
    ran = run_cli("report", tmp_path, "--format", "json")
    assert ran.code == 0, ran.err
    doc = json.loads(ran.out)
    for row in doc["ranks"].values():
        # comm: 40 + 40 us each time; overlapped: the dispatch (40) and the combine's first 10 us
        assert row["comm_s"] == pytest.approx(160e-6)
        assert row["overlapped_comm_s"] == pytest.approx(100e-6)
    [a2a] = doc["collectives"]
    assert (a2a["op"], a2a["count"], a2a["timed"]) == ("all_to_all", 8, 8)
    assert a2a["total_s"] == pytest.approx(320e-6)
    # which group, how many ranks and how many bytes the kernels do not say: none is made up
    assert (a2a["group_size"], a2a["bytes"], a2a["algbw_gbps"], a2a["busbw_gbps"]) == (None, None, None, None)
    assert "deepep" in a2a["process_group"]
    assert any("deepep" in note and "no per-peer sizes" in note for note in doc["notes"])
