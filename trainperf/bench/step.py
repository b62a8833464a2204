"""``trainperf bench step``: the trainer's step against a hand-written plain PyTorch loop.

Both run the same model (identical initial weights), the same optimizer kernel
and the same kind of batches, interleaved in one process: R rounds of K trainer
steps then K plain steps, after a warm-up of each. The figure is the ratio of
median step times: ``overhead = trainer / plain - 1``. Absolute times are
reported for context only (the machine is shared and noisy).
"""

from __future__ import annotations

import copy
import statistics
import time

from trainperf.cli._common import add_config_args, add_json_flag, print_json

DEFAULT_OVERRIDES = ["model.preset=tiny", "data.source=synthetic", "run.eval_every=0", "run.sample_tokens=0"]


def register(subparsers) -> None:
    p = subparsers.add_parser("step", help="trainer step vs a plain PyTorch loop on the same model and data")
    add_config_args(p, required=False)
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    p.add_argument("--steps", type=int, default=8, help="steps of each loop per round (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps of each loop first (default 3)")
    add_json_flag(p)
    p.set_defaults(func=run)


def plain_loop_step(model, opt, source, rng, batch, device, clip):
    """What a user writes by hand: sample, gather, forward, backward, clip, step."""
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


def measure(cfg_path, overrides, *, rounds: int, steps: int, warmup: int, progress: bool = True) -> dict:
    import numpy as np

    from trainperf.config import load_config
    from trainperf.config.resolve import resolve
    from trainperf.errors import ConfigError
    from trainperf.train.loop import build_trainer
    from trainperf.train.optim import build_optimizer

    overrides = list(overrides) if cfg_path else DEFAULT_OVERRIDES + list(overrides)
    cfg = load_config(cfg_path, overrides)
    cfg.run.progress = False
    cfg.run.steps = max(cfg.run.steps, (rounds * steps + warmup) * 2)
    resolved = resolve(cfg)
    if resolved.cfg.train.global_batch != resolved.cfg.train.micro_batch:
        raise ConfigError("bench step compares one micro-batch per step; set train.global_batch = train.micro_batch")
    if resolved.cfg.precision.dtype not in ("fp32", "tf32"):
        raise ConfigError(f"bench step's plain loop runs fp32; set precision.dtype=fp32 (got {resolved.cfg.precision.dtype})")
    trainer = build_trainer(resolved, verbose=False)
    c = trainer.cfg
    plain_model = copy.deepcopy(trainer.eager_model)
    plain_opt = build_optimizer(plain_model, c.optimizer)
    source = trainer.data.train.source
    rng = np.random.default_rng(c.run.seed)
    batch = c.train.micro_batch

    def trainer_step():
        trainer.train_step()

    def plain_step():
        plain_loop_step(plain_model, plain_opt, source, rng, batch, trainer.device, c.train.grad_clip)

    for _ in range(warmup):
        trainer_step()
        plain_step()
    times = {"trainer": [], "plain": []}
    order = [("trainer", trainer_step), ("plain", plain_step)]
    from tqdm import tqdm

    bar = tqdm(total=rounds * steps * 2, desc="bench step", unit="step", leave=False, disable=not progress)
    for r in range(rounds):
        for name, fn in (order if r % 2 == 0 else order[::-1]):  # alternate who goes first
            for _ in range(steps):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                bar.update(1)
    bar.close()
    t_med = statistics.median(times["trainer"])
    p_med = statistics.median(times["plain"])
    return {
        "trainer_step_s": t_med,
        "plain_step_s": p_med,
        "overhead": t_med / p_med - 1.0,
        "method": f"median of {rounds * steps} steps each, interleaved in {rounds} rounds of {steps}, after {warmup} warm-up",
        "model_params": sum(p.numel() for p in plain_model.parameters()),
        "micro_batch": batch,
        "seq_len": trainer.data.seq_len,
        "device": str(trainer.device),
        "optimizer_impl": c.optimizer.impl,
    }


def run(args) -> int:
    res = measure(args.config, args.overrides, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                  progress=not args.json)
    if args.json:
        print_json(res)
        return 0
    print("trainperf bench step: trainer vs hand-written loop, same model/data/optimizer")
    print(f"  trainer step  {res['trainer_step_s'] * 1000:9.2f} ms (median)")
    print(f"  plain step    {res['plain_step_s'] * 1000:9.2f} ms (median)")
    print(f"  overhead      {100 * res['overhead']:+8.2f} %   (trainer / plain - 1)")
    print(f"  ({res['method']}; {res['model_params'] / 1e6:.2f}M params, batch {res['micro_batch']} x "
          f"{res['seq_len']}, {res['device']}, AdamW {res['optimizer_impl']})")
    return 0
