"""``trainperf bench comm``: gradient/activation bytes and step time per layout and compression, on gloo.

Runs a tiny GPT (2 layers, hidden 128, sequence 32, global batch 8) in ``--world`` local gloo
processes for ``--steps`` steps per row and prints, per rank and per optimizer step:

* measured bytes: what the DDP communication hooks handed to all-reduce (payload) and the ring
  estimate of bytes sent per rank (2 (n-1)/n x payload), counted in the hooks;
* formula bytes: REFERENCE.md's volume for the same layout (DDP ring all-reduce, FSDP all-gather +
  reduce-scatter, TP 4 all-reduces of b.s.h per layer per micro-batch, PP b.s.h per boundary and
  direction per micro-batch, PowerSGD (n + m) r per compressed n x m gradient);
* step time (median of the steps after the first), which on a loaded CPU is only indicative.
"""

from __future__ import annotations

import statistics

ROWS = [
    ("data=2", {"parallelism.data": 2}),
    ("data=2 fp16", {"parallelism.data": 2, "parallelism.compression.type": "fp16"}),
    ("data=2 bf16", {"parallelism.data": 2, "parallelism.compression.type": "bf16"}),
    ("data=2 powersgd r4", {"parallelism.data": 2, "parallelism.compression.type": "powersgd",
                            "parallelism.compression.rank": 4, "parallelism.compression.warmup_steps": 2}),
    ("data_shard=2", {"parallelism.data": 1, "parallelism.data_shard": 2}),
    ("data_shard=2 reduce bf16", {"parallelism.data": 1, "parallelism.data_shard": 2,
                                  "parallelism.fsdp_reduce_dtype": "bf16"}),
    ("tensor=2", {"parallelism.data": 1, "parallelism.tensor": 2}),
    ("pipeline=2 1f1b", {"parallelism.data": 1, "parallelism.pipeline": 2}),
]
BENCH_MODEL = {"model.n_embd": 128, "model.n_head": 4}


def formula_bytes(name: str, cfg, model_numel: int, matrices: list[tuple[int, int]], vectors: int, world: int) -> int:
    """Per-rank bytes sent per optimizer step, from REFERENCE.md's formulas (fp32 unless compressed)."""
    from trainperf.distributed.fsdp import fsdp_comm_bytes

    p, t = cfg.parallelism, cfg.train
    n = world
    ring = 2 * (n - 1) / n
    b, s, h, l = t.micro_batch, cfg.model.block_size, cfg.model.n_embd, cfg.model.n_layer
    if p.data_shard > 1:
        red = 2 if p.fsdp_reduce_dtype != "fp32" else 4
        micro = t.global_batch // (t.micro_batch * n)
        return fsdp_comm_bytes(model_numel, n, reduce_bytes=red, micro_steps=micro)["total"]
    if p.tensor > 1:
        micro = t.global_batch // t.micro_batch
        return int(micro * l * 4 * ring * b * s * h * 4)
    if p.pipeline > 1:
        mb = t.global_batch // p.microbatches
        return int(p.microbatches * mb * s * h * 4)  # one boundary: activations forward or gradients backward
    if p.compression.type in ("fp16", "bf16"):
        return int(ring * model_numel * 2)
    if p.compression.type == "powersgd":
        r = p.compression.rank
        sent = vectors
        for a, c in matrices:
            sent += (a + c) * r if a * c >= 2 * (a + c) * r else a * c  # min_compression_rate 2
        return int(ring * sent * 4)
    return int(ring * model_numel * 4)


def _work(rank: int, world: int, rows: list, steps: int):
    from trainperf.bench import harness as H
    from trainperf.models.build import build_model

    out = []
    for name, overrides in rows:
        cfg = H.make_config({**BENCH_MODEL, **overrides})
        data = H.batches(cfg, steps)
        res = H.run_trainer(cfg, data, rank=rank, world=world, gather=False)
        if rank != 0:
            continue
        meta = build_model(cfg, device="cpu", materialize=False)
        numel = sum(p.numel() for p in meta.parameters())
        mats = [tuple(p.shape) for p in meta.parameters() if p.dim() == 2]
        vecs = sum(p.numel() for p in meta.parameters() if p.dim() != 2)
        last = res["comm"][-1]
        times = res["step_s"][1:] or res["step_s"]
        row = {
            "layout": name,
            "world": world,
            "measured_payload_bytes": last.get("comm_payload_bytes") or None,
            "measured_wire_bytes": last.get("comm_wire_bytes") or None,
            "formula_wire_bytes": formula_bytes(name, cfg, numel, mats, vecs, world),
            "step_s": statistics.median(times),
            "final_loss": res["losses"][-1],
            "how": "measured in DDP hooks" if last.get("comm_calls") else "formula only (collectives not hooked)",
        }
        out.append(row)
    return out


def measure(row_names: list[str] | None = None, *, steps: int = 4, world: int = 2) -> dict:
    """Run the rows (all, or those named) in ``world`` gloo processes; the result with per-row figures."""
    from trainperf.distributed.spawn import spawn
    from trainperf.errors import UserError

    rows = ROWS
    if row_names:
        unknown = [w for w in row_names if w not in dict(ROWS)]
        if unknown:
            raise UserError(f"unknown row(s) {unknown}; choose among {[n for n, _ in ROWS]}")
        rows = [r for r in ROWS if r[0] in row_names]
    if world != 2:
        raise UserError(f"--world {world}: the rows are written for 2 processes; use --world 2")
    results = spawn(_work, world, rows, steps, timeout_s=120)
    base = next((r for r in results if r["layout"] == "data=2"), None)
    for r in results:
        if base and r["measured_payload_bytes"] and base["measured_payload_bytes"]:
            r["reduction_vs_data2"] = round(base["measured_payload_bytes"] / r["measured_payload_bytes"], 2)
    return {"model": "GPT 2 layers, hidden 128, heads 4, seq 32, vocab 64, global batch 8, micro 4, fp32",
            "backend": "gloo (CPU)", "per": "rank and optimizer step", "world": world, "rows": results}
