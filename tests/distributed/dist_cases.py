"""Workers for the distributed layout tests: run in gloo processes by trainperf.distributed.spawn.spawn.

One process group per world size runs every case of that size (starting processes is the slow
part here). Each case trains a tiny GPT (2 layers, hidden 64, 4 heads, seq 32, vocab 64, global
batch 8, micro-batch 4, AdamW lr 3e-3 constant, grad clip 1.0) for a few steps on fixed random
global batches with the real ``Trainer.train_step`` and returns, on rank 0, its per-step losses,
the gathered full parameters and the one-process reference (the same Trainer, every degree 1)
on the same batches.
"""

from __future__ import annotations

import time

from trainperf.bench import harness as H

STEPS = 3
# gloo's collective timeout for these groups: a hang detector, never a speed limit. On a loaded 2-core
# machine 4 ranks (and rank 0's one-process reference, run while the others wait in the next case's first
# collective) can take minutes; a timeout there ended a rank (the four-process fixture died once).
COLLECTIVE_TIMEOUT_S = 300

TWO = {
    "data2": {"parallelism.data": 2},
    "fsdp2": {"parallelism.data": 1, "parallelism.data_shard": 2},
    "tensor2": {"parallelism.data": 1, "parallelism.tensor": 2},
    "tensor2_sp": {"parallelism.data": 1, "parallelism.tensor": 2, "parallelism.sequence_parallel": True},
    "pp2_gpipe": {"parallelism.data": 1, "parallelism.pipeline": 2, "parallelism.pipeline_schedule": "gpipe"},
    "pp2_1f1b": {"parallelism.data": 1, "parallelism.pipeline": 2, "parallelism.pipeline_schedule": "1f1b"},
    "pp2_interleaved": {"parallelism.data": 1, "parallelism.pipeline": 2, "model.n_layer": 4,
                        "parallelism.pipeline_schedule": "interleaved_1f1b", "parallelism.interleave": 2},
    # the balancer on (equal speeds: it watches, the shares stay even; the step takes the balanced path)
    "data2_balance": {"parallelism.data": 2, "parallelism.balance.enabled": True},
}
# Compressed runs: 6 steps on one repeated batch at lr 3e-3 (the loss falls from 4.17 to 3.3, 2.6 at hidden 128).
LEARN = {"optimizer.lr": 3e-3}
COMPRESSED = {
    "data2_plain": {**LEARN, "parallelism.data": 2},
    "data2_fp16": {**LEARN, "parallelism.data": 2, "parallelism.compression.type": "fp16"},
    "data2_bf16": {**LEARN, "parallelism.data": 2, "parallelism.compression.type": "bf16"},
    "data2_bf16_gather": {**LEARN, "parallelism.data": 2, "parallelism.compression.type": "bf16"},
}
# PowerSGD byte ratio on the gpt-tiny width (hidden 128); 6 steps: 2 warm-up, then compressed.
WIDE = {"model.n_embd": 128}
TWO_WIDE = {
    "wide_data2": {**WIDE, **LEARN, "parallelism.data": 2},
    "wide_powersgd": {**WIDE, **LEARN, "parallelism.data": 2, "parallelism.compression.type": "powersgd",
                      "parallelism.compression.rank": 4, "parallelism.compression.warmup_steps": 2},
}
FOUR = {
    "data2_tensor2": {"parallelism.data": 2, "parallelism.tensor": 2},
    "pp2_data2": {"parallelism.data": 2, "parallelism.pipeline": 2},
    "fsdp2_tensor2": {"parallelism.data": 1, "parallelism.data_shard": 2, "parallelism.tensor": 2},
    "fsdp2_tensor2_sp": {"parallelism.data": 1, "parallelism.data_shard": 2, "parallelism.tensor": 2,
                         "parallelism.sequence_parallel": True},
    "hsdp_2x2": {"parallelism.data": 2, "parallelism.data_shard": 2},
    # pipeline x tensor with sequence parallelism and full activation checkpointing (memory issue's apply_ac)
    "pp2_tp2_sp_ac": {"parallelism.data": 1, "parallelism.pipeline": 2, "parallelism.tensor": 2,
                      "parallelism.sequence_parallel": True, "memory.checkpointing.mode": "full"},
}


def _one(name, overrides, rank, world, steps, repeat=False, **kw):
    from trainperf.train.knobs import Knobs

    cfg = H.make_config(overrides)
    # repeat: the same global batch every step, so the loss falls (memorization) and a compressed
    # run's final loss says something; random tokens alone stay at ln(vocab).
    data = H.batches(cfg, 1) * steps if repeat else H.batches(cfg, steps)
    t0 = time.perf_counter()
    got = H.run_trainer(cfg, data, rank=rank, world=world, knobs=Knobs(bf16_gather=name.endswith("_gather")), **kw)
    if rank != 0:
        return None
    ref = H.run_reference(cfg, data)
    return {"losses": got["losses"], "ref_losses": ref["losses"], "comm": got["comm"], "params": got["params"],
            "ref_params": ref["params"], "seconds": time.perf_counter() - t0,
            "grad_norms": got["grad_norms"], "ref_grad_norms": ref["grad_norms"],
            "shares": [e.get("balance/shares") for e in got["extras"]]}


def two_process(rank: int, world: int) -> dict:
    out = {}
    for name, ov in TWO.items():
        out[name] = _one(name, ov, rank, world, STEPS)
    for name, ov in COMPRESSED.items():
        out[name] = _one(name, ov, rank, world, 6, repeat=True)
    for name, ov in TWO_WIDE.items():
        out[name] = _one(name, ov, rank, world, 6, repeat=True)
    return out


def four_process(rank: int, world: int, ckpt_dir: str) -> dict:
    out = {}
    for name, ov in FOUR.items():
        out[name] = _one(name, ov, rank, world, STEPS)
    # Resharded resume: 2 steps at data=4, saved (DCP); steps 3-4 at data=2 x tensor=2, then at
    # pipeline=2 x data=2, both from that checkpoint; compared with 4 one-process steps.
    cfg4 = H.make_config({"parallelism.data": 4})
    data = H.batches(cfg4, 4)
    H.run_trainer(cfg4, data[:2], rank=rank, world=world, gather=False, save_dir=ckpt_dir)
    ref = H.run_reference(cfg4, data) if rank == 0 else None
    for name, ov in {"resume_data2_tensor2": {"parallelism.data": 2, "parallelism.tensor": 2},
                     "resume_pp2_data2": {"parallelism.data": 2, "parallelism.pipeline": 2}}.items():
        got = H.run_trainer(H.make_config(ov), data, rank=rank, world=world, load_dir=ckpt_dir)
        if rank == 0:
            out[name] = {"losses": got["losses"], "ref_losses": ref["losses"][2:], "params": got["params"],
                         "ref_params": ref["params"], "comm": got["comm"]}
    return out


def oom_recovery(rank: int, world: int, micro: int = 4, above: int = 2) -> dict:
    """data=2, global batch 16, micro-batch ``micro`` (4: 2 micro-steps per rank; 8: one, the synchronized
    one): rank 1 fails every micro-batch above ``above`` samples (injected OutOfMemoryError) from the first
    step; with train.on_oom=halve_micro_batch both ranks agree and continue at the micro-batch that fits.
    Against the same run at that micro-batch from the start."""
    from trainperf.train.knobs import Knobs

    base = {"parallelism.data": 2, "train.global_batch": 16, "train.micro_batch": micro,
            "train.on_oom": "halve_micro_batch"}
    cfg = H.make_config(base)
    data = H.batches(cfg, 4)
    got = H.run_trainer(cfg, data, rank=rank, world=world, knobs=Knobs(oom_above=(1, above)))
    small = H.run_trainer(H.make_config({**base, "train.micro_batch": above}), data, rank=rank, world=world)
    trainer = got["trainer"]
    out = {"losses": got["losses"], "small_losses": small["losses"], "micro_batch": trainer.micro_batch,
           "accum": trainer.accum, "events": [{k: v for k, v in e.items() if k.startswith("oom/")} for e in got["extras"]],
           "params": got["params"], "small_params": small["params"]}
    gathered = [None] * world
    import torch.distributed as dist

    dist.all_gather_object(gathered, (trainer.micro_batch, trainer.accum))
    out["per_rank"] = gathered
    return out if rank == 0 else None


HF_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 32,
            "tie_word_embeddings": False}
HF_FOUR = {
    "hf_fsdp2_tp2_sp": {"parallelism.data": 1, "parallelism.data_shard": 2, "parallelism.tensor": 2,
                        "parallelism.sequence_parallel": True},
    "hf_data2_tp2": {"parallelism.data": 2, "parallelism.tensor": 2},
}


def hf_config(overrides: dict):
    """The harness's tiny run with a Hugging Face Llama (GQA, SwiGLU, SDPA) as the model."""
    from trainperf.config.schema import HFModelConfig

    cfg = H.make_config({"model.block_size": 16, **overrides})
    cfg.model.hf = HFModelConfig(config=dict(HF_LLAMA))
    cfg.model.n_layer = cfg.model.n_head = cfg.model.n_embd = None
    return cfg


def hf_four_process(rank: int, world: int) -> dict:
    """A tiny HF Llama through the real Trainer at FSDP2 x TP=2 (+SP) and DDP x TP=2 against one process."""
    out = {}
    for name, ov in HF_FOUR.items():
        cfg = hf_config(ov)
        data = H.batches(cfg, STEPS)
        got = H.run_trainer(cfg, data, rank=rank, world=world)
        if rank == 0:
            ref = H.run_reference(cfg, data)
            out[name] = {"losses": got["losses"], "ref_losses": ref["losses"], "params": got["params"],
                         "ref_params": ref["params"], "notes": got["notes"], "grad_norms": got["grad_norms"],
                         "ref_grad_norms": ref["grad_norms"]}
    return out if rank == 0 else None
