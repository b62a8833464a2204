"""What each mechanism contributed to a predicted step (``trainperf plan --explain``; no torch).

For the plan's best layout, every mechanism that applies to it is switched to its alternative and the
step timed again with everything else held: the contribution is ``step with it - step without it``
(negative: the mechanism saves that much). Mechanisms interact (a faster GEMM leaves less compute to
hide communication behind), so the contributions do not add up to the step exactly; each is what that
one mechanism moves, the rest as the plan has it.

Mechanisms (module that times each in brackets):

* the part's GEMM ceiling: its published maximum achievable matmul FLOPS against an A100's fraction of
  its own peak (:mod:`trainperf.planner.parts`; on an A100 itself, nothing to compare);
* the part's NCCL bandwidths as published (ring on NVLink 4, NDR NICs) against the generic fractions of
  the link rates (``published_fabric``), and NVLink SHARP for all-reduces (``nvls``);
* tensor-parallel communication overlapped with the GEMMs (``async_tp``: Megatron-Core's tp-comm-overlap,
  torchtitan's AsyncTP);
* FP8 linears (``float8``) and Transformer Engine's once-per-step FP8 weight cast (``fp8_weight_cache``);
* the data-parallel gradient reduction overlapped with the backward (``dp_reduce``) and the distributed
  optimizer's parameter all-gather with the forward (``param_gather``);
* fused elementwise kernels (``fused``) and the FlashAttention generation (``attention_kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainperf.planner import parts
from trainperf.planner.cost import Estimate, estimate


@dataclass(frozen=True)
class Mechanism:
    name: str
    setting: str
    """What the plan uses."""
    without: str
    """The alternative it is compared with."""
    step_without_s: float
    contribution_s: float
    """Step with the mechanism minus step without it (negative: it saves time)."""
    what: str

    def as_dict(self, step_s: float) -> dict:
        return {"mechanism": self.name, "setting": self.setting, "without": self.without,
                "step_without_s": round(self.step_without_s, 4), "contribution_s": round(self.contribution_s, 4),
                "contribution_pct": round(100 * self.contribution_s / step_s, 2) if step_s > 0 else None,
                "what": self.what}


def _candidates(est: Estimate, gpu, stack, c):
    """(name, setting, without, what, the stack / constants / GPU to time it without) for each mechanism that
    applies to ``est``'s layout."""
    L = est.layout
    dp_ranks = L.dp * L.cp
    fsdp = L.zero >= 3 and L.shard_group > 1
    ref = parts.FACTS.get("NVIDIA A100-SXM4-80GB")
    frac = parts.sustained_fraction(gpu) if c.published_gemm else gpu.gemm_fraction
    if c.published_gemm and parts.facts(gpu).mamf_fraction and ref and abs(frac - ref.mamf_fraction) > 1e-9:
        yield ("gemm_generation", f"{100 * frac:.1f}% of the dense peak (published MAMF)",
               f"an A100's {100 * ref.mamf_fraction:.1f}%",
               "the fraction of its dense peak a large GEMM reaches on this generation (parts.py)",
               stack, c, replace(gpu, gemm_fraction=ref.mamf_fraction), dict(published_gemm=0.0))
    f = parts.facts(gpu)
    if c.published_fabric and (f.ring_busbw_gbps or f.nic_busbw_gbps) and (L.gpus > 1):
        yield ("nccl_fabric", "NCCL bandwidths published for the part (ring, NIC)",
               f"{c.nvlink_fraction:g} of NVLink / {c.internode_fraction:g} of the NIC rate",
               "what NCCL reaches on this node's NVLink and per NIC between nodes (nccl-tests figures, parts.py)",
               stack, c, gpu, dict(published_fabric=0.0))
    if stack.nvls and f.nvls_busbw_gbps and (L.tp > 1 and not L.sequence_parallel
                                                                     or (L.zero == 0 and dp_ranks > 1)):
        yield ("nvls", "NVLink SHARP all-reduce (NCCL >= 2.17 default)", "ring all-reduce",
               "all-reduces within an NVSwitch 3 node reduced in the switch", replace(stack, nvls=False), c, gpu, {})
    if stack.async_tp and L.tp > 1:
        yield ("tp_comm_overlap", f"async_tp ({stack.tp_overlap})", "TP collectives on the critical path",
               "tensor-parallel communication overlapped with the GEMMs (Megatron-Core tp-comm-overlap, AsyncTP)",
               replace(stack, async_tp=False), c, gpu, {})
    if stack.float8 and getattr(gpu, "fp8_tflops", 0):
        yield ("float8", "FP8 linears", "BF16 linears", "the linear layers' GEMMs at the FP8 peak, with their casts",
               replace(stack, float8=False), c, gpu, {})
        if stack.fp8_weight_cache:
            yield ("fp8_weight_cache", "FP8 weights cast once per step", "cast every micro-batch",
                   "Transformer Engine's FP8 weight copies reused across micro-batches (is_first_microbatch)",
                   replace(stack, fp8_weight_cache=False), c, gpu, {})
    if dp_ranks > 1 and not fsdp and stack.dp_reduce == "overlap":
        yield ("grad_reduce_overlap", f"overlapped, {stack.dp_bucket} buckets", "after the backward",
               "the data-parallel gradient reduction beside the backward; its last bucket stays exposed",
               replace(stack, dp_reduce="after", param_gather=stack.param_gather_mode), c, gpu, {})
    if dp_ranks > 1 and L.zero in (1, 2) and stack.param_gather_mode == "overlap":
        yield ("param_gather_overlap", "overlapped with the next forward", "before the forward",
               "the distributed optimizer's parameter all-gather beside the forward",
               replace(stack, param_gather="after"), c, gpu, {})
    yield ("fused", "fused" if stack.fused else "unfused (eager)", "unfused" if stack.fused else "fused",
           "elementwise kernels (norms, activation, residual adds, RoPE, FP8 casts) fused or one per op",
           replace(stack, fused=not stack.fused), c, gpu, {})
    if getattr(gpu, "mma_sync_fraction", 1.0) < 1.0 and (stack.attention or "flash") == "flash":
        other = "fa2" if stack.attention_kernel == "fa3" else "fa3"
        yield ("attention_kernel", stack.attention_kernel, other,
               "FlashAttention's generation: fa2 runs Ampere's mma.sync at 2/3 of a Hopper GPU's rate",
               replace(stack, attention_kernel=other), c, gpu, {})


def explain(est: Estimate, model, gpu, global_batch: int, c, stack) -> list[Mechanism]:
    """Each applicable mechanism's contribution to ``est`` (module doc), largest first."""
    out = []
    for name, setting, without, what, st, cc, g, const in _candidates(est, gpu, stack, c):
        alt = estimate(model, g, est.layout, global_batch, replace(cc, **const) if const else cc, stack=st)
        out.append(Mechanism(name, setting, without, alt.step_time_s, est.step_time_s - alt.step_time_s, what))
    out.sort(key=lambda m: -abs(m.contribution_s))
    return out


def render(mechs: list[Mechanism], est: Estimate) -> list[str]:
    """Text lines of the explanation."""
    from trainperf.planner.report import _table

    if not mechs:
        return []
    rows = [["mechanism", "this plan", "compared with", "step without s", "contribution"]]
    for m in mechs:
        pct = 100 * m.contribution_s / est.step_time_s if est.step_time_s > 0 else 0.0
        rows.append([m.name, m.setting, m.without, f"{m.step_without_s:.2f}", f"{m.contribution_s:+.2f} s ({pct:+.1f}%)"])
    lines = [f"what each mechanism contributed to the best layout's {est.step_time_s:.2f} s (step with it - step "
             "without it, everything else held; negative saves time):"]
    lines += ["  " + ln for ln in _table(rows, {3, 4})]
    lines += [f"  {m.name}: {m.what}" for m in mechs]
    return lines
