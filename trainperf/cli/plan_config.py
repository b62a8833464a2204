"""``trainperf plan --emit-config FILE``: the best layout as a config ``trainperf train`` accepts (no torch)."""

from __future__ import annotations

from trainperf.errors import UserError


def emit_config(plan, path: str) -> str:
    """Write the best layout as a config `trainperf train` accepts (validated before writing)."""
    import os

    import yaml

    from trainperf.config.load import build_config
    from trainperf.config.resolve import check_batch, check_pipeline_schedule
    from trainperf.models.presets import PRESETS
    from trainperf.train.resolve import check_model_shape

    best = plan.best
    L, model = best.layout, plan.model
    if not path.strip():
        raise UserError(f"--emit-config {path!r} is empty; give a file name, e.g. plan.yaml")
    if L.cp > 1:  # the config has no context parallelism: a config without it would be another layout
        raise UserError(f"--emit-config: the best layout ({L.short()}) splits the sequence over {L.cp} ranks "
                        "(context parallelism), which `trainperf train` does not run; pin --cp 1 to emit a "
                        "config it can run")
    if model.name in PRESETS:
        model_cfg = {"preset": model.name}
    else:
        model_cfg = {"preset": "tiny", "n_layer": model.layers, "n_head": model.heads, "n_embd": model.hidden,
                     "block_size": model.seq, "vocab_size": model.vocab}
    fsdp = L.zero >= 1
    group = L.shard if 0 < L.shard < L.dp else L.dp  # HSDP: sharded within groups, replicated across them
    if L.recompute == "partial":  # whole layers per stage: the same share of blocks, spread evenly
        layers_stage = -(-model.layers // L.pp)
        ckpt = {"mode": "ratio", "ratio": round(L.recompute_layers / layers_stage, 6)}
    else:
        ckpt = {"mode": L.recompute}
    data = {
        "model": model_cfg,
        "train": {"global_batch": plan.global_batch, "micro_batch": L.micro_batch},
        "precision": {"dtype": "bf16"},
        "parallelism": {
            "data": L.dp // group if fsdp else L.dp,
            "data_shard": group if fsdp else 1,
            "tensor": L.tp,
            "pipeline": L.pp,
            "interleave": L.interleave,
            "microbatches": best.microbatches,
            # torch's 1F1B needs a micro-batch per stage; with fewer, GPipe (the same bubble then) runs it
            "pipeline_schedule": ("interleaved_1f1b" if L.interleave > 1
                                  else "1f1b" if best.microbatches >= L.pp else "gpipe"),
            "sequence_parallel": L.sequence_parallel,
        },
        "memory": {"checkpointing": ckpt},
    }
    cfg = build_config(data, source="trainperf plan --emit-config")
    check_batch(cfg)
    check_model_shape(cfg)
    check_pipeline_schedule(cfg)
    header = (
        f"# Written by trainperf plan: {model.name} on {plan.gpus} x {plan.gpu.key}\n"
        f"# layout {L.short()}: estimated {best.step_time_s:.2f} s/step, {best.tflops_per_gpu:.0f} TFLOP/s per GPU "
        f"(model FLOPs), {best.memory_bytes / 2**30:.1f} GiB per GPU\n"
    )
    if L.recompute == "partial":
        header += (f"# The plan recomputes {L.recompute_layers} whole layer(s) of each stage's {-(-model.layers // L.pp)}: "
                   "written as that share of the blocks (memory.checkpointing.mode ratio).\n")
    if L.zero in (1, 2):
        header += (f"# The plan used ZeRO-{L.zero}; trainperf expresses sharding as FSDP (data_shard), which shards "
                   "parameters too (less memory, more traffic than planned).\n")
    from trainperf.runio import atomic_write_text

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"--emit-config {path!r}: directory {parent} does not exist")
    if os.path.isdir(path):
        raise UserError(f"--emit-config {path!r} is a directory; give a file name, e.g. {os.path.join(path, 'plan.yaml')}")
    try:  # atomic: an existing config is replaced whole or not at all
        atomic_write_text(path, header + yaml.safe_dump(data, sort_keys=False))
    except OSError as exc:
        raise UserError(f"--emit-config {path!r}: cannot write it ({exc.strerror or exc}); choose a writable path") from None
    return path
