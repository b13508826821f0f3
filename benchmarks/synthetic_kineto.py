"""Synthetic torch.profiler (Kineto) traces of a DDP training job on NCCL, one file per rank, as
``torch.profiler.tensorboard_trace_handler`` writes them: realistic enough that Holistic Trace Analysis (HTA)
and ``comm2perfetto report`` read them as they read real traces. No torch needed.

Each rank runs ``steps`` profiled steps of a ``layers``-block transformer under DDP (bf16 kernels, fp32
gradients) on one GPU of an 8-GPU node:

- the main thread (tid == pid) opens ``ProfilerStep#n``, copies the batch in on a side stream, runs the
  forward pass, and after backward the optimizer, a loss all-reduce and ``loss.item()`` (a device-to-host copy
  and a ``cudaStreamSynchronize``, which ends the step on the CPU);
- the autograd thread (``pt_autograd_0``) runs backward and, every ``bucket_layers`` blocks, launches DDP's
  bucket all-reduce (``nccl:all_reduce`` > ``record_param_comms`` > ``cuLaunchKernelEx``);
- GPU: compute kernels, ``Memset`` and the device-to-host ``Memcpy`` on stream 7, the batch's ``Memcpy HtoD`` on
  stream 15, NCCL kernels on stream 20; ``gpu_user_annotation`` ranges for ``ProfilerStep#n`` (every stream)
  and ``nccl:all_reduce`` (stream 20); ``ac2g`` flow events from each launch to its kernel.

The ranks are simulated together, so collectives end together: a rank's NCCL kernel starts when its bucket is
ready (stream wait on the compute stream) and ends when the last rank's has started plus the transfer time;
the optimizer waits for the last bucket. One straggler rank (1.3x slower kernels) and a per-rank speed jitter
make overlap differ from rank to rank: fast ranks wait inside NCCL for the straggler. Every node's clock has
its own offset. Everything is seeded: the same arguments write the same bytes.

Each kernel brings a CPU op or two, a launch and two flow events: the default 20 steps of 24 blocks are about
84,000 events (19 MiB) a rank. :func:`write_job` also returns each rank's exact overlap of communication with
compute (HTA's definition, on every kernel, to the nanosecond), to check readers against::

    python benchmarks/synthetic_kineto.py /tmp/traces --ranks 8            # 8 files, rank<r>.pt.trace.json
    python benchmarks/synthetic_kineto.py /tmp/traces --ranks 64 --gzip    # .pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson

# Kineto's baseTimeNanoseconds is the start of the 7889238-second interval the process started in; ts are
# microseconds after it (~10**12 here, as in real traces).
BASE_NS = 227 * 7_889_238 * 1_000_000_000
T0_NS = 4_464_633_909_000_000  # the first event, relative to BASE_NS
NODE_CLOCK_SKEW_NS = 137_211  # per node: hosts' clocks disagree; each rank's trace is on its host's clock
GPUS_PER_NODE = 8
COMPUTE_STREAM, COPY_STREAM, NCCL_STREAM = 7, 15, 20

COMPUTE, COMM, MEMORY = "compute", "comm", "memory"

_GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
         "kernel__5x_cublas")
_GEMM_NN = ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8>"
            "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8::Params)")
_GEMM_WGRAD = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nt"
_LN = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
       "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)")
_LN_BWD = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
           "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
           "c10::BFloat16*, int)")
_LN_GAMMA = ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, float>"
             "(long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
             "c10::BFloat16*, c10::BFloat16*)")
_FLASH = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
          "false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, "
          "false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
_FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::Flash_bwd_kernel_"
              "traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_"
              "traits<128, 64, 128, 8, cutlass::bfloat16_t> >, false, true, false, false, true, true, false>"
              "(pytorch_flash::Flash_bwd_params)")
_FLASH_DOT = ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, pytorch_flash::Flash_bwd_kernel_traits<128, 64, "
              "128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 64, "
              "128, 8, cutlass::bfloat16_t> > >(pytorch_flash::Flash_bwd_params)")
_ADD = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)")
_GELU = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
         "{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl("
         "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
         "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)")
_GELU_BWD = ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl("
             "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
             "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul> >(int, "
             "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}"
             "::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
             "std::array<char*, 3ul>)")
_BIAS_GRAD = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<"
              "float, at::native::sum_functor<c10::BFloat16, float, float>::operator()(at::TensorIterator&)::"
              "{lambda(float, float)#1}>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::"
              "func_wrapper_t<float, at::native::sum_functor<c10::BFloat16, float, float>::operator()("
              "at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4>)")
_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::"
            "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)")
_NLL = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>(float*, "
        "float*, float const*, long const*, float const*, bool, long, long, long, long)")
_ADAM = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
         "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
         "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, "
         "float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::"
         "FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, "
         "double, double, bool, float*, float*)")
_NCCL_BUCKET = "ncclDevKernel_AllReduce_Sum_f32_RING_LL128(ncclDevComm*, unsigned long, ncclWork*)"
_NCCL_SMALL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
_H2D, _D2H, _MEMSET = "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)", "Memset (Device)"


@dataclass(frozen=True)
class Op:
    """One CPU op (nested names, outermost first) and the GPU work it launches: (name, category, mean us)."""

    cpu: tuple[str, ...]
    gpu: tuple[tuple[str, str, float], ...]
    cpu_us: float = 10.0  # the op's own CPU time, launches aside
    shapes: tuple[tuple[int, ...], ...] = ((8, 2048, 2048),)


def _k(name: str, us: float) -> tuple[str, str, float]:
    """A kernel of ``us`` microseconds on average."""
    return name, "kernel", us


_LINEAR = ("aten::linear", "aten::addmm")
FORWARD_BLOCK = (
    Op(("aten::layer_norm", "aten::native_layer_norm"), (_k(_LN, 18.0),)),
    Op(_LINEAR, (_k(_GEMM, 160.0),), 14.0, ((8, 2048, 2048), (6144, 2048))),
    Op(("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
        "aten::_flash_attention_forward"), (_k(_FLASH, 240.0),), 22.0),
    Op(_LINEAR, (_k(_GEMM, 60.0),), 14.0, ((8, 2048, 2048), (2048, 2048))),
    Op(("aten::add",), (_k(_ADD, 14.0),), 7.0),
    Op(("aten::layer_norm", "aten::native_layer_norm"), (_k(_LN, 18.0),)),
    Op(_LINEAR, (_k(_GEMM_NN, 210.0),), 14.0, ((8, 2048, 2048), (8192, 2048))),
    Op(("aten::gelu",), (_k(_GELU, 38.0),), 7.0),
    Op(_LINEAR, (_k(_GEMM, 200.0),), 14.0, ((8, 2048, 8192), (2048, 8192))),
    Op(("aten::add",), (_k(_ADD, 14.0),), 7.0),
)
_EVAL = "autograd::engine::evaluate_function: "
_ADDMM_BWD = Op((_EVAL + "AddmmBackward0", "AddmmBackward0", "aten::mm"),
                (_k(_GEMM_NN, 190.0), _k(_GEMM_WGRAD, 200.0), _k(_BIAS_GRAD, 12.0)), 18.0)
BACKWARD_BLOCK = (
    Op((_EVAL + "AddBackward0",), (), 3.0),
    _ADDMM_BWD,
    Op((_EVAL + "GeluBackward0", "GeluBackward0", "aten::gelu_backward"), (_k(_GELU_BWD, 52.0),), 9.0),
    _ADDMM_BWD,
    Op((_EVAL + "NativeLayerNormBackward0", "NativeLayerNormBackward0", "aten::native_layer_norm_backward"),
       (_k(_LN_BWD, 26.0), _k(_LN_GAMMA, 21.0)), 14.0),
    _ADDMM_BWD,
    Op((_EVAL + "ScaledDotProductFlashAttentionBackward0", "ScaledDotProductFlashAttentionBackward0",
        "aten::_flash_attention_backward"),
       (("Memset (Device)", "gpu_memset", 3.0), _k(_FLASH_DOT, 9.0), _k(_FLASH_BWD, 560.0)), 24.0),
    _ADDMM_BWD,
    Op((_EVAL + "NativeLayerNormBackward0", "NativeLayerNormBackward0", "aten::native_layer_norm_backward"),
       (_k(_LN_BWD, 26.0), _k(_LN_GAMMA, 21.0)), 14.0),
    Op(("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", "torch::autograd::AccumulateGrad",
        "aten::add_"), (_k(_ADD, 16.0),), 8.0),
)
LOSS = (
    Op(("aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax"), (_k(_SOFTMAX, 95.0),), 16.0),
    Op(("aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss_forward"), (_k(_NLL, 11.0),), 12.0),
)
BATCH_COPY = Op(("aten::to", "aten::_to_copy", "aten::copy_"), ((_H2D, "gpu_memcpy", 180.0),), 12.0, ((8, 2048),))
LOSS_ITEM = Op(("aten::item", "aten::_local_scalar_dense"), ((_D2H, "gpu_memcpy", 2.0),), 9.0, ((),))
OPTIMIZER = tuple(Op(("aten::_fused_adamw_",), (_k(_ADAM, 310.0),), 40.0) for _ in range(6))

_KERNEL_ARGS: dict[str, Any] = {"queued": 0, "context": 1, "registers per thread": 168, "shared memory": 98304,
                                "blocks per SM": 1.0, "warps per SM": 8.0, "grid": [132, 1, 1],
                                "block": [384, 1, 1], "est. achieved occupancy %": 13}


@dataclass
class JobStats:
    """What :func:`write_job` wrote: files, events per rank, GPU work per class, and each rank's exact
    overlap (``100 * |union(compute) ∩ union(comm)| / |union(comm)|`` over every kernel, in ns)."""

    files: list[Path] = field(default_factory=list)
    events: dict[int, int] = field(default_factory=dict)
    gpu_counts: dict[int, dict[str, int]] = field(default_factory=dict)
    overlap_pct: dict[int, float] = field(default_factory=dict)
    straggler: int = 0
    bytes: int = 0


def union(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Disjoint, sorted spans covering the same time (touching spans merge)."""
    out: list[tuple[int, int]] = []
    for b, e in sorted(spans):
        if out and b <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((b, e))
    return out


def intersection_length(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """|a ∩ b| of two unions."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class _Pending(NamedTuple):
    """An NCCL kernel launched, to be placed once every rank has launched its own."""

    kernel: dict[str, Any]
    tid: int
    launch: int
    correlation: int
    annotation: int  # External id of its nccl:all_reduce annotation


class _Rank:
    """One rank's clocks (ns on the true clock), id counters and this step's events."""

    def __init__(self, rank: int, world: int, seed: int, straggler: int) -> None:
        self.rank, self.world = rank, world
        self.rng = random.Random(seed * 1_000_003 + rank)
        self.pid = 31_000 + 97 * rank
        self.main, self.autograd = self.pid, self.pid + 211
        self.device = rank % GPUS_PER_NODE
        self.speed = (1.3 if rank == straggler else 1.0) * (1.0 + self.rng.uniform(-0.08, 0.08))
        self.skew = (rank // GPUS_PER_NODE) * NODE_CLOCK_SKEW_NS
        self.cpu = {self.main: 0, self.autograd: 0}
        self.free = {COMPUTE_STREAM: 0, COPY_STREAM: 0, NCCL_STREAM: 0}
        self.external = 0
        self.correlation = self.rng.randint(400_000, 900_000)  # CUPTI ids count from process start
        self.ev_idx = 0
        self.events: list[dict[str, Any]] = []
        self.gpu: dict[str, list[tuple[int, int]]] = {COMPUTE: [], COMM: [], MEMORY: []}
        self.step_gpu: dict[int, list[int]] = {}  # stream -> [first begin, last end] this step
        self.count = 0

    # --- building events -------------------------------------------------------------------------------

    def ts(self, ns: int) -> float:
        """Kineto's ts (microseconds after BASE_NS, on this node's clock) of ``ns`` on the true clock."""
        return (T0_NS + self.skew + ns) / 1000  # exact to the ns: the nearest float to a 3-decimal number

    def cpu_event(self, tid: int, cat: str, name: str, begin: int, end: int, **args: Any) -> dict[str, Any]:
        self.external += 1
        self.ev_idx += 1
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid, "ts": self.ts(begin),
              "dur": (end - begin) / 1000,
              "args": {"External id": self.external, "Record function id": 0, "Ev Idx": self.ev_idx, **args}}
        self.events.append(ev)
        return ev

    def runtime(self, tid: int, name: str, begin: int, dur: int, external: int, cat: str = "cuda_runtime",
                cbid: int = 211) -> int:
        self.correlation += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid,
                            "ts": self.ts(begin), "dur": dur / 1000,
                            "args": {"External id": external, "cbid": cbid, "correlation": self.correlation}})
        return self.correlation

    def gpu_event(self, stream: int, name: str, cat: str, begin: int, dur: int, external: int, correlation: int,
                  launch_tid: int, launch_ns: int, klass: str) -> None:
        extra = _KERNEL_ARGS if cat == "kernel" else {"bytes": 4_194_304, "memory bandwidth (GB/s)": 24.5}
        ev = {"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream, "ts": self.ts(begin),
              "dur": dur / 1000, "args": {"External id": external, "device": self.device, "stream": stream,
                                         "correlation": correlation, **extra}}
        self.events.append(ev)
        # Kineto's flow from the launch to its kernel ("ac2g": async CPU to GPU); id = correlation.
        self.events.append({"ph": "s", "id": correlation, "pid": self.pid, "tid": launch_tid,
                            "ts": self.ts(launch_ns), "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": correlation, "pid": self.device, "tid": stream, "ts": self.ts(begin),
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.gpu[klass].append((begin, begin + dur))
        span = self.step_gpu.setdefault(stream, [begin, begin + dur])
        span[0], span[1] = min(span[0], begin), max(span[1], begin + dur)

    def place(self, stream: int, earliest: int, dur: int) -> int:
        """Queue ``dur`` ns on ``stream`` no earlier than ``earliest``; returns the begin."""
        begin = max(self.free[stream] + self.rng.randint(600, 2_500), earliest)
        self.free[stream] = begin + dur
        return begin

    def kernel_ns(self, mean_us: float) -> int:
        """A kernel's duration on this rank's GPU: slower on the straggler, with some noise."""
        return max(1_000, int(mean_us * 1000 * self.speed * self.rng.lognormvariate(0.0, 0.06)))

    def op(self, tid: int, op: Op, stream: int = COMPUTE_STREAM, wait: int = 0) -> int:
        """Run ``op`` on CPU thread ``tid`` now; its GPU work goes on ``stream``, not before ``wait``. Returns the
        GPU end of its last launch (``wait`` when it launches nothing)."""
        rng = self.rng
        begin = self.cpu[tid]
        t = begin + (len(op.cpu) - 1) * rng.randint(400, 1_500) + int(op.cpu_us * 1000 * rng.uniform(0.6, 1.0))
        launches = []
        for name, cat, us in op.gpu:
            dur = rng.randint(2_800, 5_200)
            launches.append((t, dur, name, cat, us))
            t += dur + rng.randint(300, 900)
        t += rng.randint(300, 1_200)
        shapes = {"Input Dims": [list(s) for s in op.shapes], "Input type": ["c10::BFloat16"] * len(op.shapes)}
        for depth, name in enumerate(op.cpu):  # nested: each inside the one before
            inner = len(op.cpu) - 1 - depth
            self.cpu_event(tid, "cpu_op", name, begin + depth * 400, t + inner * rng.randint(200, 700), **shapes)
        external = self.external  # the innermost op's: what Kineto puts on its launches and kernels
        end_gpu = wait
        for at, dur, name, cat, us in launches:
            call = "cudaMemsetAsync" if cat == "gpu_memset" else "cudaMemcpyAsync" if cat == "gpu_memcpy" \
                else "cudaLaunchKernel"
            correlation = self.runtime(tid, call, at, dur, external)
            if cat == "kernel":
                klass, gdur = COMPUTE, self.kernel_ns(us)
            else:
                klass, gdur = MEMORY, max(1_000, int(us * 1000 * rng.uniform(0.8, 1.3)))
            gbegin = self.place(stream, max(at + rng.randint(3_500, 6_000), wait), gdur)
            self.gpu_event(stream, name, cat, gbegin, gdur, external, correlation, tid, at, klass)
            end_gpu = gbegin + gdur
        self.cpu[tid] = t + len(op.cpu) * 700 + rng.randint(1_000, 4_000)
        return end_gpu

    def annotation(self, tid: int, name: str, begin: int, end: int, **args: Any) -> dict[str, Any]:
        return self.cpu_event(tid, "user_annotation", name, begin, end, **args)

    def comm_launch(self, tid: int, nelems: int) -> _Pending:
        """DDP's (or the user's) all-reduce call on ``tid``: ``nccl:all_reduce`` > ``record_param_comms`` >
        event record, stream wait, ``cuLaunchKernelEx``. The kernel's times wait for the other ranks."""
        rng = self.rng
        begin = self.cpu[tid]
        t = begin + rng.randint(2_000, 5_000)
        comm_args = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": nelems,
                     "Out msg nelems": nelems, "Group size": self.world, "Process Group Name": "0",
                     "Process Group Description": "default_pg",
                     "Process Group Ranks": str(list(range(self.world))), "Rank": self.rank}
        ann = self.annotation(tid, "nccl:all_reduce", begin, begin)
        rpc = self.cpu_event(tid, "cpu_op", "record_param_comms", begin + 900, begin + 900, **comm_args)
        external = rpc["args"]["External id"]
        self.runtime(tid, "cudaEventRecord", t, rng.randint(1_500, 3_000), external, cbid=135)
        t += rng.randint(4_000, 6_000)
        self.runtime(tid, "cudaStreamWaitEvent", t, rng.randint(1_500, 3_000), external, cbid=147)
        t += rng.randint(4_000, 7_000)
        launch, dur = t, rng.randint(6_000, 11_000)
        correlation = self.runtime(tid, "cuLaunchKernelEx", t, dur, external, cat="cuda_driver", cbid=652)
        t += dur + rng.randint(2_000, 4_000)
        rpc["dur"] = (t - begin - 900) / 1000
        ann["dur"] = (t + 1_000 - begin) / 1000
        self.cpu[tid] = t + rng.randint(5_000, 9_000)
        kernel = {"ph": "X", "cat": "kernel", "name": _NCCL_SMALL if nelems < 1024 else _NCCL_BUCKET,
                  "pid": self.device, "tid": NCCL_STREAM, "ts": 0.0, "dur": 0.0,
                  "args": {"External id": external, "device": self.device, "stream": NCCL_STREAM,
                           "correlation": correlation, **_KERNEL_ARGS, "grid": [32, 1, 1], "block": [640, 1, 1],
                           **{k: v for k, v in comm_args.items() if k != "Rank"}}}
        return _Pending(kernel, tid, launch, correlation, ann["args"]["External id"])

    def place_comm(self, pending: _Pending, begin: int, end: int) -> None:
        kernel, tid, launch, correlation, annotation = pending
        kernel["ts"], kernel["dur"] = self.ts(begin), (end - begin) / 1000
        self.events.append(kernel)
        self.events.append({"ph": "s", "id": correlation, "pid": self.pid, "tid": tid,
                            "ts": self.ts(launch), "cat": "ac2g", "name": "ac2g"})
        self.events.append({"ph": "f", "id": correlation, "pid": self.device, "tid": NCCL_STREAM,
                            "ts": self.ts(begin), "cat": "ac2g", "name": "ac2g", "bp": "e"})
        # Kineto projects the enclosing user annotation onto the stream the kernel ran on.
        self.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "pid": self.device,
                            "tid": NCCL_STREAM, "ts": self.ts(begin), "dur": (end - begin) / 1000,
                            "args": {"External id": annotation}})
        self.free[NCCL_STREAM] = end
        self.gpu[COMM].append((begin, end))
        span = self.step_gpu.setdefault(NCCL_STREAM, [begin, end])
        span[0], span[1] = min(span[0], begin), max(span[1], end)

    def flush(self, out: IO[bytes], first: bool) -> None:
        if self.events:
            out.write((b"  " if first else b",\n  ") + b",\n  ".join(map(orjson.dumps, self.events)))
        self.count += len(self.events)
        self.events.clear()


def _collective(ranks: list[_Rank], pending: list[_Pending], ready: list[int],
                transfer_ns: int, rng: random.Random) -> list[int]:
    """Place one all-reduce on every rank: each starts when its input is ready (and its NCCL stream free),
    all end once the last has started and the data has moved. Returns each rank's end."""
    starts = [max(r.free[NCCL_STREAM] + r.rng.randint(1_000, 3_000), ready_r,
                  p.launch + r.rng.randint(4_000, 7_000)) for r, p, ready_r in zip(ranks, pending, ready)]
    done = max(starts) + int(transfer_ns * rng.uniform(0.95, 1.08))
    ends = []
    for r, p, s in zip(ranks, pending, starts):
        end = done + r.rng.randint(0, 3_000)
        r.place_comm(p, s, end)
        ends.append(end)
    return ends


def _header(r: _Rank, world: int) -> bytes:
    # json (not orjson) for the header: HTA finds a file's rank with the regex '"rank":\s+(\d+)', which needs
    # the space after the colon that Kineto (and json.dumps) write.
    device = {"id": r.device, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929216512, "computeMajor": 9,
              "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
              "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
              "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
              "sharedMemPerMultiprocessor": 233472}
    info = {"backend": "nccl", "rank": r.rank, "world_size": world, "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": world, "ranks": list(range(world))}], "nccl_version": "2.21.5"}
    lines = ['{', '  "schemaVersion": 1,', f'  "deviceProperties": [\n    {json.dumps(device)}\n  ],',
             '  "cupti_version": 24,', '  "cuda_runtime_version": 12040,',
             f'  "distributedInfo": {json.dumps(info)},', '  "record_shapes": 1,', '  "with_stack": 0,',
             '  "cuda_driver_version": 12040,', f'  "trace_id": "{0x5EED0000 + r.rank:016X}",',
             '  "traceEvents": [\n']
    return "\n".join(lines).encode()


def _metadata(r: _Rank) -> None:
    ts = r.ts(0)
    meta = [(r.pid, 0, "process_name", {"name": "python"}), (r.pid, 0, "process_labels", {"labels": "CPU"}),
            (r.pid, 0, "process_sort_index", {"sort_index": r.pid}),
            (r.device, 0, "process_name", {"name": f"GPU {r.device}"}),
            (r.device, 0, "process_labels", {"labels": "NVIDIA H100 80GB HBM3"}),
            (r.device, 0, "process_sort_index", {"sort_index": 5000000 + r.device}),
            (r.pid, r.main, "thread_name", {"name": f"thread {r.main} (python)"}),
            (r.pid, r.autograd, "thread_name", {"name": f"thread {r.autograd} (pt_autograd_0)"})]
    meta += [(r.device, s, "thread_name", {"name": f"stream {s} "}) for s in (COMPUTE_STREAM, COPY_STREAM,
                                                                              NCCL_STREAM)]
    for pid, tid, name, args in meta:
        r.events.append({"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": args})


def _create(path: Path, compress: bool) -> IO[bytes]:
    """A new trace file; gzip at level 1 (speed over size) and without a timestamp (same bytes each run)."""
    return gzip.GzipFile(path, "wb", compresslevel=1, mtime=0) if compress else path.open("wb")


def _step(ranks: list[_Rank], n: int, layers: int, bucket_layers: int, bucket_transfer_ns: int,
          shared: random.Random) -> None:
    """One profiled step, ``ProfilerStep#n``, on every rank; the collectives tie the ranks together."""
    bucket_nelems = bucket_layers * 12 * 1024 * 1024  # bucket_layers blocks of 12 x 1M fp32 gradients
    step_begin = {}
    for r in ranks:
        r.step_gpu = {}
        step_begin[r.rank] = r.cpu[r.main]
        r.cpu[r.main] += r.rng.randint(3_000, 9_000)
        end = r.op(r.main, BATCH_COPY, COPY_STREAM)
        r.cpu[r.main] += r.rng.randint(20_000, 60_000)  # Python between steps: the data loader
        forward_begin = r.cpu[r.main]
        for _ in range(layers):
            for op in FORWARD_BLOCK:
                end = r.op(r.main, op, wait=end)  # the first waits for the batch's copy
        for op in LOSS:
            r.op(r.main, op)
        r.annotation(r.main, "DistributedDataParallel.forward", forward_begin, r.cpu[r.main])
        r.cpu[r.autograd] = r.cpu[r.main] + r.rng.randint(15_000, 30_000)  # loss.backward()
    # Backward, in buckets (the last blocks' gradients first), each all-reduced as soon as it is ready.
    for first in range(0, layers, bucket_layers):
        ready, pending = [], []
        for r in ranks:
            last = 0
            for _ in range(min(bucket_layers, layers - first)):
                for op in BACKWARD_BLOCK:
                    last = r.op(r.autograd, op) or last
            ready.append(last)
            pending.append(r.comm_launch(r.autograd, bucket_nelems))
        _collective(ranks, pending, ready, bucket_transfer_ns, shared)
    ready, pending = [], []
    for r in ranks:
        r.cpu[r.main] = max(r.cpu[r.main], r.cpu[r.autograd]) + r.rng.randint(10_000, 25_000)
        optimizer_begin = r.cpu[r.main]
        wait = r.free[NCCL_STREAM]  # DDP: the compute stream waits for the last bucket's all-reduce
        for op in OPTIMIZER:
            wait = r.op(r.main, op, wait=wait)
        r.annotation(r.main, "Optimizer.step#AdamW.step", optimizer_begin, r.cpu[r.main])
        ready.append(r.free[COMPUTE_STREAM])
        pending.append(r.comm_launch(r.main, 1))  # the loss, averaged over ranks for logging
    ends = _collective(ranks, pending, ready, 18_000, shared)
    for r, comm_end in zip(ranks, ends):
        copy_end = r.op(r.main, LOSS_ITEM, wait=comm_end)
        sync_begin = r.cpu[r.main]  # loss.item() waits for the GPU: the step ends with it
        r.runtime(r.main, "cudaStreamSynchronize", sync_begin, max(copy_end - sync_begin, 2_000) + 1_500,
                  r.external, cbid=131)
        r.cpu[r.main] = max(copy_end, sync_begin) + r.rng.randint(4_000, 8_000)
        step = r.annotation(r.main, f"ProfilerStep#{n}", step_begin[r.rank], r.cpu[r.main])
        # Kineto projects ProfilerStep#n onto every stream that ran the step's work, with only its External id.
        for stream, (b, e) in sorted(r.step_gpu.items()):
            r.events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}",
                             "pid": r.device, "tid": stream, "ts": r.ts(b), "dur": (e - b) / 1000,
                             "args": {"External id": step["args"]["External id"]}})
        r.cpu[r.autograd] = r.cpu[r.main]


def write_job(folder: Path, world: int, steps: int = 20, layers: int = 24, bucket_layers: int = 4,
              seed: int = 0, compress: bool = False) -> JobStats:
    """Write one trace per rank into ``folder`` (``rank<r>.pt.trace.json``, ``.gz`` with ``compress``)."""
    folder.mkdir(parents=True, exist_ok=True)
    shared = random.Random(seed)
    straggler = (5 * world) // 8 + 1 if world > 1 else 0  # some rank in the middle of a node
    ranks = [_Rank(r, world, seed, straggler) for r in range(world)]
    suffix = ".pt.trace.json.gz" if compress else ".pt.trace.json"
    paths = [folder / f"rank{r.rank}{suffix}" for r in ranks]
    # Ring all-reduce of a bucket: 2(n-1)/n of its bytes over each rank's link, NVLink inside a node,
    # 400 Gb/s InfiniBand across nodes.
    bus = 150e9 if world <= GPUS_PER_NODE else 46e9
    bucket_bytes = bucket_layers * 12 * 1024 * 1024 * 4
    bucket_transfer_ns = int(2 * (world - 1) / world * bucket_bytes / bus * 1e9) + 25_000
    with ExitStack() as stack:
        outs = [stack.enter_context(_create(p, compress)) for p in paths]
        for r, out in zip(ranks, outs):
            out.write(_header(r, world))
            _metadata(r)
            r.flush(out, first=True)
            r.cpu[r.main] = r.cpu[r.autograd] = 50_000 + r.rng.randint(0, 20_000)
        for step in range(steps):
            _step(ranks, step + 5, layers, bucket_layers, bucket_transfer_ns, shared)  # after wait and warmup
            for r, out in zip(ranks, outs):
                r.flush(out, first=False)
        for r, out in zip(ranks, outs):
            end = max(r.cpu[r.main], *r.free.values()) + 10_000
            # Kineto's own rows: the profiling window and its end mark (pids that are not processes).
            r.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                             "tid": "PyTorch Profiler", "ts": r.ts(0), "dur": end / 1000, "args": {"Op count": 0}})
            r.events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                             "ts": r.ts(end)})
            r.flush(out, first=False)
            trailer = {"traceName": str(paths[r.rank]), "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
            out.write(b"\n],\n" + json.dumps(trailer)[1:].encode() + b"\n")
    stats = JobStats(straggler=straggler)
    for r, path in zip(ranks, paths):
        comp, comm = union(r.gpu[COMPUTE]), union(r.gpu[COMM])
        comm_ns = sum(e - b for b, e in comm)
        stats.files.append(path)
        stats.events[r.rank] = r.count
        stats.gpu_counts[r.rank] = {k: len(v) for k, v in r.gpu.items()}
        stats.overlap_pct[r.rank] = 100.0 * intersection_length(comp, comm) / comm_ns if comm_ns else 0.0
        stats.bytes += path.stat().st_size
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    p.add_argument("--layers", type=int, default=24, help="transformer blocks (default 24)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gzip", action="store_true", help="write .pt.trace.json.gz")
    args = p.parse_args(argv)
    stats = write_job(args.folder, args.ranks, args.steps, args.layers, seed=args.seed, compress=args.gzip)
    events = sum(stats.events.values())
    print(f"{len(stats.files)} traces in {args.folder}: {events:,} events ({events // len(stats.files):,} a rank), "
          f"{stats.bytes / 2**20:.1f} MiB; straggler rank {stats.straggler}; overlap % per rank "
          f"{min(stats.overlap_pct.values()):.2f} to {max(stats.overlap_pct.values()):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
