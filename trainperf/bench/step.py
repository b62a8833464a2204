"""``trainperf bench step``: the trainer's step against a hand-written plain PyTorch loop.

Both run the same model (identical initial weights), the same optimizer kernel
and the same kind of batches, interleaved in one process: R rounds of K trainer
steps then K plain steps (the order alternates each round), after a warm-up of
each. The figure is the ratio of median step times: ``overhead = trainer /
plain - 1``. Absolute times are reported for context only.

``--variants`` adds rows measured the same way (interleaved with the baseline
trainer): bf16 autocast, fp16 autocast + GradScaler (CUDA only), torch.compile
of the whole model and per block (regional), each with its speed-up over the
fp32 eager trainer and, for compiled rows, the compile time (first step).
"""

from __future__ import annotations

import copy
import statistics
import time

DEFAULT_OVERRIDES = ["model.preset=tiny", "data.source=synthetic", "run.eval_every=0", "run.sample_tokens=0"]

VARIANTS = {
    "bf16": ["precision.dtype=bf16"],
    "fp16+scaler": ["precision.dtype=fp16"],
    "compile": ["compile.enabled=true"],
    "compile-regional": ["compile.enabled=true", "compile.regional=true"],
}


def plain_loop_step(model, opt, source, rng, batch, device, clip):
    """The baseline this benchmark measures the Trainer against (not a step trainperf trains with):
    what a user writes by hand: sample, gather, forward, backward, clip, step."""
    import torch

    idx = rng.integers(0, len(source), size=batch)
    w = torch.from_numpy(source.gather(idx).astype("int64")).to(device)
    x, y = w[:, :-1], w[:, 1:]
    _, loss = model(x, y)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def _trainer(cfg_path, overrides, steps_needed):
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve
    from trainperf.train.build import build_trainer

    cfg = load_config(cfg_path, overrides)
    cfg.run.progress = False
    cfg.run.steps = max(cfg.run.steps, steps_needed)
    return build_trainer(resolve(cfg), verbose=False)


def _variants_for(names, device_type: str) -> tuple[dict, dict]:
    names = list(VARIANTS) if names == [] else (names or [])
    chosen, skipped = {}, {}
    for name in names:
        if name not in VARIANTS:
            from trainperf.errors import UserError

            raise UserError(f"--variants {name!r} is unknown; choose among {', '.join(VARIANTS)}")
        if name == "fp16+scaler" and device_type != "cuda":
            skipped[name] = "fp16 autocast with loss scaling needs CUDA"
            continue
        chosen[name] = VARIANTS[name]
    return chosen, skipped


def measure(cfg_path, overrides, *, rounds: int, steps: int, warmup: int, variants=None,
            progress: bool = True) -> dict:
    import numpy as np

    from trainperf.errors import ConfigError
    from trainperf.train.optim import build_optimizer

    _variants_for(variants, "cuda")  # an unknown name is refused before the data is prepared (no side effect)
    overrides = list(overrides) if cfg_path else DEFAULT_OVERRIDES + list(overrides)
    needed = (rounds * steps + warmup) * 2
    trainer = _trainer(cfg_path, overrides, needed)
    c = trainer.cfg
    if c.train.global_batch != c.train.micro_batch:
        raise ConfigError("bench step compares one micro-batch per step; set train.global_batch = train.micro_batch")
    if c.precision.dtype not in ("fp32", "tf32"):
        raise ConfigError(f"bench step's plain loop runs fp32; set precision.dtype=fp32 (got {c.precision.dtype})")
    plain_model = copy.deepcopy(trainer.model)
    plain_opt = build_optimizer(plain_model, c.optimizer)
    source = trainer.data.train.source
    rng = np.random.default_rng(c.run.seed)
    batch = c.train.micro_batch

    chosen, skipped = _variants_for(variants, trainer.device.type)
    loops = {"trainer": trainer.train_step,
             "plain": lambda: plain_loop_step(plain_model, plain_opt, source, rng, batch, trainer.device,
                                              c.train.grad_clip)}
    compile_s = {}
    for name, extra in chosen.items():
        vt = _trainer(cfg_path, overrides + extra, needed)
        t0 = time.perf_counter()
        vt.train_step()  # first step: compilation for compiled rows
        compile_s[name] = time.perf_counter() - t0
        if "compile" in name and vt.notes.get("compile", "").startswith("fell back"):
            skipped[name] = vt.notes["compile"]
            continue
        loops[name] = vt.train_step

    for fn in loops.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in loops}
    order = list(loops.items())
    from tqdm import tqdm

    bar = tqdm(total=rounds * steps * len(order), desc="bench step", unit="step", leave=False, disable=not progress)
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):  # alternate who goes first
            for _ in range(steps):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                bar.update(1)
    bar.close()
    med = {name: statistics.median(ts) for name, ts in times.items()}
    rows = [{"name": name, "step_s": med[name], "speedup_vs_trainer_fp32": med["trainer"] / med[name],
             "compile_s": compile_s.get(name)} for name in loops if name not in ("trainer", "plain")]
    return {
        "trainer_step_s": med["trainer"],
        "plain_step_s": med["plain"],
        "overhead": med["trainer"] / med["plain"] - 1.0,
        "variants": rows,
        "skipped": skipped,
        "method": f"median of {rounds * steps} steps each, interleaved in {rounds} rounds of {steps}, after {warmup} warm-up",
        "model_params": sum(p.numel() for p in plain_model.parameters()),
        "micro_batch": batch,
        "seq_len": trainer.data.seq_len,
        "device": str(trainer.device),
        "optimizer_impl": c.optimizer.impl,
    }
