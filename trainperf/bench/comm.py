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


def register(subparsers) -> None:
    from trainperf.cli._common import add_json_flag

    p = subparsers.add_parser("comm", help="bytes and time per step for each parallel layout and compression",
                              description=__doc__)
    p.add_argument("--world", type=int, default=2, help="local gloo processes (default 2)")
    p.add_argument("--steps", type=int, default=4, help="steps per row (PowerSGD compresses from step 3)")
    p.add_argument("--rows", default=None, help="comma-separated row names to run (default: all)")
    add_json_flag(p)
    p.set_defaults(func=run)


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
    from trainperf.distributed import harness as H
    from trainperf.models.build import build_model

    out = []
    for name, overrides in rows:
        cfg = H.make_config({**BENCH_MODEL, **overrides})
        data = H.batches(cfg, steps)
        res = H.run_layout(cfg, data, rank=rank, world=world, gather=False)
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
            "measured_payload_bytes": last["comm_payload_bytes"] or None,
            "measured_wire_bytes": last["comm_wire_bytes"] or None,
            "formula_wire_bytes": formula_bytes(name, cfg, numel, mats, vecs, world),
            "step_s": statistics.median(times),
            "final_loss": res["losses"][-1],
            "how": "measured in DDP hooks" if last["comm_calls"] else "formula only (collectives not hooked)",
        }
        out.append(row)
    return out


def run(args) -> int:
    from trainperf.cli._common import print_json
    from trainperf.distributed.harness import spawn
    from trainperf.errors import UserError

    rows = ROWS
    if args.rows:
        wanted = [r.strip() for r in args.rows.split(",")]
        unknown = [w for w in wanted if w not in dict(ROWS)]
        if unknown:
            raise UserError(f"unknown row(s) {unknown}; choose among {[n for n, _ in ROWS]}")
        rows = [r for r in ROWS if r[0] in wanted]
    if args.world != 2:
        raise UserError("--world: the rows are written for 2 processes; use --world 2")
    results = spawn(_work, args.world, rows, args.steps, timeout_s=120)
    base = next((r for r in results if r["layout"] == "data=2"), None)
    for r in results:
        if base and r["measured_payload_bytes"] and base["measured_payload_bytes"]:
            r["reduction_vs_data2"] = round(base["measured_payload_bytes"] / r["measured_payload_bytes"], 2)
    if args.json:
        print_json({"model": "GPT 2 layers, hidden 128, heads 4, seq 32, vocab 64, global batch 8, micro 4, fp32",
                    "backend": "gloo (CPU)", "per": "rank and optimizer step", "rows": results})
        return 0
    print("trainperf bench comm: tiny GPT (2 layers, hidden 128, seq 32, global batch 8), gloo on CPU, "
          f"{args.world} processes; bytes per rank per optimizer step")
    hdr = f"{'layout':<26}{'payload B':>12}{'wire B':>12}{'formula B':>12}{'x fewer':>9}{'step ms':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        fmt = lambda v: f"{v:,}" if v else "-"  # noqa: E731
        red = r.get("reduction_vs_data2")
        print(f"{r['layout']:<26}{fmt(r['measured_payload_bytes']):>12}{fmt(r['measured_wire_bytes']):>12}"
              f"{r['formula_wire_bytes']:>12,}{(f'{red:.1f}' if red else '-'):>9}{r['step_s'] * 1000:>9.0f}")
    print("payload/wire: measured in the DDP hooks (wire = ring estimate 2(n-1)/n x payload); formula: REFERENCE.md; "
          "'-' = those collectives are not hooked (FSDP2, DTensor, pipeline p2p). Step times on a shared CPU are "
          "indicative only.")
    return 0
