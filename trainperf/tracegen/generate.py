"""Realistic single-rank torch.profiler traces, generated deterministically (a seed), for tests and benchmarks.

``make_trace(path, kind, steps=4, layout="lines", fmt=None, units=None, seed=0) -> dict`` writes one trace
and returns what was put in it. A trace is simulated, not drawn: a CPU clock issues launches
(``cudaLaunchKernel`` / ``cuLaunchKernel`` / ``cudaMemcpyAsync``, each ``launch_us`` long, with its
correlation id, ``ac2g`` flows and ``External id``), and each GPU stream runs its kernels in order, a kernel
starting when both its stream is free and its launch has reached the GPU (``queue_us`` after the call);
cross-stream waits (a collective waits for the gradients it reduces, experts wait for the dispatch) are
``cudaStreamWaitEvent``-style dependencies. So host-bound gaps, back-to-back gaps and overlap arise as they
would on a device. Per step: ``ProfilerStep#N`` (and its ``gpu_user_annotation`` copy in 2.x), a DataLoader
``__next__`` span, host-to-device copies, forward / backward / optimizer kernels, ``aten::item`` with its
``cudaStreamSynchronize`` at the end.

Kinds:

* ``a100_ddp``: A100, fp32 (sgemm) with some TF32 GEMMs, DDP all-reduce buckets (NCCL, stream 40)
  overlapping the backward, a multi-process DataLoader, pinned copies, triton kernels via ``cuLaunchKernel``.
* ``v100_18``: the 1.8-era format (``Kernel``, ``Runtime``, ``Operator``, ``Memcpy``, ``Memset``;
  ``external id``; ``"tid": "stream 7"``; integer us; no deviceProperties), V100 kernel names (sgemm,
  scudnn, h884), a single-process DataLoader (data-bound) and pageable copies.
* ``moe_a2a``: H100 bf16 MoE: DeepEP ``deep_ep::intranode::notify_dispatch`` / ``dispatch`` / ``combine``
  on their own stream (50) overlapping shared-expert compute, expert GEMMs (``sm90_xmma``), FlashAttention
  2, NCCL all-reduce for the dense gradients.
* ``fp8_tuned``: an expert-tuned H100 trace: FP8 ``sm90_xmma_gemm_e4m3...``, ``nvjet``, CUTLASS warp-specialized
  and FlashAttention 3 kernels at one block per SM (132 blocks, low estimated occupancy by design), the host
  far ahead (GPU busy), reduce-scatter / all-gather hidden under compute, pinned non-blocking copies, no
  host sync.
* ``launch_bound``: many tiny kernels, the GPU waiting for the host.
* ``cpu_only``: CPU ops and annotations only (as trainperf's own CPU runs write).

``fmt``: "2x" or "1.8" (default: by kind); ``units``: "us" (integer microseconds, torch <= 2.3) or "ns"
(float microseconds with nanosecond decimals and ``baseTimeNanoseconds``, torch >= 2.4); ``layout``:
"lines" (one event per line, as torch writes) or "single" (one line); a ``.gz`` name is gzipped (mtime 0:
the same seed gives the same bytes).
"""

from __future__ import annotations

import gzip
import io
import json
import random
from pathlib import Path
from typing import Any

KINDS = ("a100_ddp", "v100_18", "moe_a2a", "fp8_tuned", "launch_bound", "cpu_only")

A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920, "computeMajor": 8,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 108}
H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984, "computeMajor": 9,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132}

EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
NAMES = {
    "a100_ddp": {"gemm": ["ampere_sgemm_128x64_tn", "ampere_sgemm_64x64_nn",
                          "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel"],
                 "ew": [EW, "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(int, float, float const*, float const*, float const*, float*, float*, float*)"],
                 "triton": ["triton_poi_fused_add_gelu_0", "triton_red_fused_native_layer_norm_1"],
                 "comm": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"],
                 "opt": ["void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, float*>(...)"]},
    "v100_18": {"gemm": ["volta_sgemm_128x64_nn", "volta_scudnn_128x64_relu_interior_nn_v1", "volta_h884gemm_64x64_ldg8_nn"],
                "ew": ["void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 512, true, 1>(cudnnTensorStruct, float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, float)",
                       "void at::native::vectorized_elementwise_kernel<4, at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3> >(int, at::native::threshold_kernel_impl<float>(at::TensorIteratorBase&, float, float)::{lambda(float, float)#1}, at::detail::Array<char*, 3>)"],
                "triton": [], "comm": [],
                "opt": ["void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::SGDFunctor<float, 3, 1>, float, float>(...)"]},
    "moe_a2a": {"gemm": ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
                         "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, false>(flash::Flash_fwd_params)"],
                "ew": ["void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>, at::native::index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1} const&)::{lambda(int)#1}>(long, at::native::gpu_index_kernel<...>::{lambda(int)#1})"],
                "triton": ["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"],
                "a2a": ["void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, int const*, int*, int*, int, int, void**, int**, int)",
                        "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, int, int, int, void**, int, int, int)",
                        "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, __nv_bfloat16 const*, float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, int const*, int const*, int const*, int const*, int, int, int, void**, int, int, int, int)"],
                "comm": ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"],
                "opt": ["void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, float*>(...)"]},
    "fp8_tuned": {"gemm": ["sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
                           "nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT",
                           "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<4, cute::tuple<cute::C<2>, cute::C<1>, cute::C<1> >, cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum>, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, cutlass::float_e4m3_t, cutlass::float_e4m3_t> > >(...)",
                           "void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false, false, false, false, false, false, false, true, true, false, false>, flash::CollectiveEpilogueFwd<...>, flash::VarlenDynamicPersistentTileScheduler<128, 128, 256, 128, false, true, true, true, false, true> >(...)"],
                  "ew": [],
                  "triton": ["triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton_poi_fused__scaled_mm_amax_1"],
                  "comm": ["ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                           "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"],
                  "opt": ["void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, double, bool, float*, float*>(...)"]},
}
NAMES["launch_bound"] = {"gemm": ["ampere_sgemm_32x32_sliced1x4_nn"], "ew": [EW], "triton": [], "comm": [],
                         "opt": NAMES["a100_ddp"]["opt"]}


class _Sim:
    """The CPU clock, the GPU streams, the ids and the events written so far."""

    def __init__(self, rng: random.Random, fmt: str, units: str, t0: float):
        self.rng, self.fmt, self.units = rng, fmt, units
        self.t = t0  # CPU time, us
        self.gpu: dict[int, float] = {}
        self.corr = 0
        self.ext = 0
        self.cpu: list[dict] = []
        self.dev: list[dict] = []
        self.pid, self.tid = 4242, 4242
        self.kernels = 0
        self.queue_us = 4.0
        self.cur: int | None = None  # the External id of the op being run: its launches carry it

    def _ts(self, x: float):
        return int(round(x)) if self.units == "us" else round(x, 3)

    def _cat(self, c2: str) -> str:
        if self.fmt == "2x":
            return c2
        return {"cpu_op": "Operator", "user_annotation": "Operator", "cuda_runtime": "Runtime",
                "cuda_driver": "Runtime", "kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}[c2]

    def _ext_key(self) -> str:
        return "External id" if self.fmt == "2x" else "external id"

    def cpu_span(self, cat: str, name: str, start: float, end: float, ext: int | None = None) -> None:
        ev = {"ph": "X", "cat": self._cat(cat), "name": name, "pid": self.pid, "tid": self.tid,
              "ts": self._ts(start), "dur": self._ts(max(end - start, 0.0))}
        if ext is not None:
            ev["args"] = {self._ext_key(): ext}
        self.cpu.append(ev)

    def launch(self, name: str, dur: float, stream: int, *, cat: str = "kernel", api: str | None = None,
               after: float = 0.0, launch_us: float = 5.0, args: dict | None = None, gap: float = 3.0,
               driver: bool = False) -> tuple[float, float]:
        """A launch call now on the CPU and its GPU event; returns the GPU (start, end)."""
        self.corr += 1
        if self.cur is None:
            self.ext += 1
        c, x = self.corr, (self.cur if self.cur is not None else self.ext)
        api = api or ("cuLaunchKernel" if driver else "cudaLaunchKernel" if cat == "kernel" else
                      "cudaMemcpyAsync" if cat == "gpu_memcpy" else "cudaMemsetAsync")
        start = max(self.gpu.get(stream, 0.0), self.t + launch_us + self.queue_us, after)
        end = start + dur
        self.gpu[stream] = end
        rt = {"ph": "X", "cat": self._cat("cuda_driver" if driver else "cuda_runtime"), "name": api,
              "pid": self.pid, "tid": self.tid, "ts": self._ts(self.t), "dur": self._ts(launch_us),
              "args": {"correlation": c, self._ext_key(): x} if self.fmt == "2x" else
              {"cbid": 211, "correlation": c, "external id": x}}
        self.cpu.append(rt)
        flow = "ac2g" if self.fmt == "2x" else "async"
        self.cpu.append({"ph": "s", "id": c, "pid": self.pid, "tid": self.tid, "ts": self._ts(self.t), "cat": flow,
                         "name": flow})
        a = {self._ext_key(): x, "queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": c}
        if cat == "kernel":
            a.update({"registers per thread": 64, "shared memory": 0, "blocks per SM": 2.0, "warps per SM": 16.0,
                      "grid": [216, 1, 1], "block": [256, 1, 1], "est. achieved occupancy %": 50})
        a.update(args or {})
        tid = stream if self.fmt == "2x" else f"stream {stream}"
        self.dev.append({"ph": "X", "cat": self._cat(cat), "name": name, "pid": 0, "tid": tid,
                         "ts": self._ts(start), "dur": self._ts(dur), "args": a})
        self.dev.append({"ph": "f", "id": c, "pid": 0, "tid": tid, "ts": self._ts(start), "cat": flow, "name": flow,
                         "bp": "e"})
        self.t += launch_us + gap
        self.kernels += cat == "kernel"
        return start, end

    def op(self, name: str, body, *args, **kw):
        """A cpu_op around ``body`` (which launches)."""
        self.ext += 1
        x = self.ext
        s = self.t
        self.t += 2.0
        outer, self.cur = self.cur, x
        out = body(*args, **kw)
        self.cur = outer
        self.t += 2.0
        self.cpu_span("cpu_op", name, s, self.t, x)
        return out


def _jit(rng: random.Random, x: float, f: float = 0.08) -> float:
    return x * (1.0 + rng.uniform(-f, f))


def _step(sim: _Sim, kind: str, n: int, names: dict) -> dict[str, float]:
    rng = sim.rng
    info: dict[str, float] = {}
    two = sim.fmt == "2x"
    # the DataLoader
    dl = {"v100_18": 30_000.0, "a100_ddp": 400.0, "moe_a2a": 300.0, "fp8_tuned": 60.0, "launch_bound": 100.0,
          "cpu_only": 800.0}[kind]
    it = "_SingleProcessDataLoaderIter" if kind in ("v100_18", "cpu_only") else "_MultiProcessingDataLoaderIter"
    s = sim.t
    sim.t += _jit(rng, dl)
    sim.ext += 1
    sim.cpu_span("user_annotation", f"enumerate(DataLoader)#{it}.__next__", s, sim.t, sim.ext)
    info["dataloader_us"] = sim.t - s
    if kind == "cpu_only":
        for i in range(12):
            s = sim.t
            sim.t += _jit(rng, 300.0)
            sim.ext += 1
            sim.cpu_span("cpu_op", "aten::mm" if i % 2 else "aten::add", s, sim.t, sim.ext)
        return info
    # host-to-device copies
    pageable = kind == "v100_18"
    sizes = (65536, 256) if kind in ("fp8_tuned", "moe_a2a") else (3 * 224 * 224 * 4 * 32, 256)
    copy_stream = 9 if kind == "fp8_tuned" else 7  # the tuned job copies on a side stream, non-blocking
    for b in sizes:
        dur = b / (10e3 if pageable else 20e3)  # bytes / (bytes per us)
        cname = "Memcpy HtoD (Pageable -> Device)" if pageable else "Memcpy HtoD (Pinned -> Device)"
        sim.launch(cname, dur, copy_stream, cat="gpu_memcpy", launch_us=(dur + 20 if pageable else 6.0),
                   args={"bytes": b, "memory bandwidth (GB/s)": b / dur / 1e3})
    g = names["gemm"]
    ew = names["ew"] or names["triton"]
    layers = {"v100_18": 16, "a100_ddp": 12, "moe_a2a": 6, "fp8_tuned": 12, "launch_bound": 60}[kind]
    gemm_us = {"v100_18": 600.0, "a100_ddp": 450.0, "moe_a2a": 300.0, "fp8_tuned": 260.0, "launch_bound": 6.0}[kind]
    ew_us = {"v100_18": 90.0, "a100_ddp": 60.0, "moe_a2a": 40.0, "fp8_tuned": 25.0, "launch_bound": 2.0}[kind]
    cpu_gap = {"v100_18": 25.0, "a100_ddp": 12.0, "moe_a2a": 10.0, "fp8_tuned": 3.0, "launch_bound": 20.0}[kind]
    ws = {"blocks per SM": 1.0, "warps per SM": 12.0, "grid": [132, 1, 1], "block": [384, 1, 1],
          "est. achieved occupancy %": 12} if kind == "fp8_tuned" else None

    def gemm(i):
        name = g[i % len(g)]
        return sim.launch(name, _jit(rng, gemm_us), 7, gap=cpu_gap, args=ws)

    def elementwise(i):
        if kind in ("fp8_tuned", "a100_ddp", "moe_a2a") and names["triton"] and i % 3 == 0:
            return sim.launch(names["triton"][i % len(names["triton"])], _jit(rng, ew_us), 7, driver=True, gap=cpu_gap)
        return sim.launch(ew[i % len(ew)], _jit(rng, ew_us), 7, gap=cpu_gap,
                          args={"blocks per SM": 8.0, "est. achieved occupancy %": 80})

    sim.ext += 1
    fwd_ext, fwd_s = sim.ext, sim.t
    for i in range(layers):
        if kind == "moe_a2a":
            sim.op("aten::_flash_attention_forward", gemm, 1)
            a2a = names["a2a"]
            # expert parallel: notify + dispatch on stream 50, the shared expert on stream 7 meanwhile
            _, ready = sim.gpu.get(7, 0.0), sim.gpu.get(7, 0.0)
            sim.launch(a2a[0], _jit(rng, 30.0), 50, after=ready, gap=cpu_gap)
            _, d_end = sim.launch(a2a[1], _jit(rng, 380.0), 50, gap=cpu_gap)
            sim.op("aten::mm", gemm, 0)  # shared expert, overlaps the dispatch
            sim.launch(ew[0], _jit(rng, ew_us), 7, after=d_end, gap=cpu_gap)  # permute: waits for the dispatch
            for _ in range(2):
                sim.op("aten::mm", gemm, 0)  # experts
            sim.launch(a2a[2], _jit(rng, 350.0), 50, after=sim.gpu[7], gap=cpu_gap)
            sim.op("aten::add", elementwise, i)
        else:
            sim.op("aten::linear", gemm, i)
            sim.op("aten::add", elementwise, i)
            if kind == "fp8_tuned":
                sim.op("aten::_scaled_mm", gemm, i + 1)
    sim.cpu_span("user_annotation", "## forward ##", fwd_s, sim.t, fwd_ext)
    # backward, with communication buckets
    sim.ext += 1
    bwd_ext, bwd_s = sim.ext, sim.t
    comm = names["comm"]
    every = {"a100_ddp": 3, "moe_a2a": 3, "fp8_tuned": 2}.get(kind, 0)
    comm_us = {"a100_ddp": 900.0, "moe_a2a": 500.0, "fp8_tuned": 180.0}.get(kind, 0.0)
    for i in range(layers):
        sim.op("aten::mm", gemm, i + 1)
        sim.op("aten::mm", gemm, i)
        sim.op("aten::mul", elementwise, i + 1)
        if comm and every and (i + 1) % every == 0:
            extra = {"Collective name": "allreduce" if "AllReduce" in comm[0] else "reduce_scatter",
                     "Process Group Name": "0", "Process Group Description": "default_pg", "Group size": 8,
                     "dtype": "Float", "In msg nelems": 1 << 22, "Out msg nelems": 1 << 22,
                     "blocks per SM": 0.2, "est. achieved occupancy %": 0}
            name = comm[(i // every) % len(comm)]
            if "AllGather" in name:
                extra["Collective name"] = "allgather"
            sim.op("record_param_comms", lambda: sim.launch(name, _jit(rng, comm_us), 40, after=sim.gpu.get(7, 0.0),
                                                            args=extra if two else None, gap=cpu_gap))
    sim.cpu_span("user_annotation", "## backward ##", bwd_s, sim.t, bwd_ext)
    # the optimizer waits for the last bucket
    last = sim.gpu.get(40, 0.0)
    def optimizer():
        for j in range(3 if kind != "launch_bound" else 40):
            sim.launch(names["opt"][0], _jit(rng, 150.0 if kind != "launch_bound" else 3.0), 7,
                       after=last if j == 0 else 0.0, gap=cpu_gap)

    sim.op("Optimizer.step#AdamW.step", optimizer)
    sim.op("aten::zero_", lambda: sim.launch("Memset (Device)", 2.0, 7, cat="gpu_memset"))
    # loss.item(): a device-to-host copy and a stream sync (not in the tuned trace)
    if kind != "fp8_tuned":
        sim.ext += 1
        item_ext, s_item = sim.ext, sim.t
        sim.t += 3
        sim.ext += 1
        lsd_ext, s_lsd = sim.ext, sim.t
        _, end = sim.launch("Memcpy DtoH (Device -> Pinned)", 2.0, 7, cat="gpu_memcpy", launch_us=6.0,
                            args={"bytes": 4})
        s_sync = sim.t
        sim.t = max(sim.t + 2.0, end + 3.0)
        sim.corr += 1
        sim.cpu.append({"ph": "X", "cat": sim._cat("cuda_runtime"), "name": "cudaStreamSynchronize",
                        "pid": sim.pid, "tid": sim.tid, "ts": sim._ts(s_sync), "dur": sim._ts(sim.t - s_sync),
                        "args": {"correlation": sim.corr, sim._ext_key(): lsd_ext}})
        info["sync_us"] = sim.t - s_sync
        sim.cpu_span("cpu_op", "aten::_local_scalar_dense", s_lsd, sim.t + 1, lsd_ext)
        sim.t += 2
        sim.cpu_span("cpu_op", "aten::item", s_item, sim.t, item_ext)
    sim.t += 20.0
    return info


def _write(path: Path, meta_head: dict, events: list[dict], meta_tail: dict, layout: str) -> None:
    buf = io.StringIO()
    if layout == "single":
        d = dict(meta_head)
        d["traceEvents"] = events
        d.update(meta_tail)
        buf.write(json.dumps(d, separators=(",", ":")))
    else:
        buf.write("{\n")
        for k, v in meta_head.items():
            buf.write(f'  "{k}": {json.dumps(v)},\n')
        buf.write('  "traceEvents": [\n')
        for i, e in enumerate(events):
            buf.write("  " + json.dumps(e) + (",\n" if i < len(events) - 1 else "\n"))
        buf.write("  ]")
        for k, v in meta_tail.items():
            buf.write(f',\n  "{k}": {json.dumps(v)}')
        buf.write("\n}\n")
    data = buf.getvalue().encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.name.endswith(".gz"):
        with open(tmp, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as z:
            z.write(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(path)


def make_trace(path: str | Path, kind: str = "a100_ddp", *, steps: int = 4, layout: str = "lines",
               fmt: str | None = None, units: str | None = None, seed: int = 0, rank: int = 0,
               world: int = 1) -> dict[str, Any]:
    """Write one generated rank's trace (see the module docstring); returns what it holds."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: choose one of {', '.join(KINDS)}")
    if layout not in ("lines", "single"):
        raise ValueError(f"layout={layout!r}: use 'lines' or 'single'")
    fmt = fmt or ("1.8" if kind == "v100_18" else "2x")
    units = units or ("us" if fmt == "1.8" else "ns")
    if fmt not in ("2x", "1.8") or units not in ("us", "ns"):
        raise ValueError(f"fmt={fmt!r}, units={units!r}: fmt is '2x' or '1.8', units 'us' or 'ns'")
    rng = random.Random(seed)
    t0 = 1_700_000_000_000_000.0 if units == "us" else 5_000_000_000.0 + rng.random()
    sim = _Sim(rng, fmt, units, t0)
    names = NAMES.get(kind, NAMES["a100_ddp"])
    per = []
    sim.t += 1000.0
    for n in range(steps):
        sim.ext += 1
        s, x = sim.t, sim.ext
        info = _step(sim, kind, n, names)
        sim.cpu_span("user_annotation", f"ProfilerStep#{n + 1}", s, sim.t, x)
        if fmt == "2x" and kind != "cpu_only":
            sim.dev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 0,
                            "tid": 7, "ts": sim._ts(s + 10), "dur": sim._ts(max(sim.gpu.get(7, s) - s, 1.0)),
                            "args": {"External id": x}})
        per.append(info)
        sim.t = max(sim.t, 0.0) + 10.0
    meta_head: dict[str, Any] = {"schemaVersion": 1}
    if kind != "v100_18" and kind != "cpu_only":
        meta_head["deviceProperties"] = [dict(H100 if kind in ("moe_a2a", "fp8_tuned") else A100)]
    if fmt == "2x":
        meta_head["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    meta_head["record_shapes"] = 1
    meta = [{"ph": "M", "name": "process_name", "pid": sim.pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": sim._ts(t0), "dur": sim._ts(sim.t - t0)}]
    events = meta + sim.cpu + sim.dev
    tail = {"traceName": Path(path).name, "displayTimeUnit": "ms"}
    if units == "ns":
        tail["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    _write(Path(path), meta_head, events, tail, layout)
    return {"path": str(path), "kind": kind, "fmt": fmt, "units": units, "layout": layout, "steps": steps,
            "events": len(events), "kernels": sim.kernels, "per_step": per,
            "comm_kernels": sorted(set(names.get("comm", []) + names.get("a2a", []))),
            "tensor_core_kernels": [n for n in names.get("gemm", []) if "sgemm" not in n and "scudnn" not in n]}


__all__ = ["KINDS", "make_trace"]
