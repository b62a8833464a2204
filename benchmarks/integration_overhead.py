"""The monitor's overhead inside Hugging Face Trainer and Lightning, side by side.

For each framework, the same training run (a small Llama for HF, a small MLP LM for Lightning, CPU,
``--steps`` steps) is repeated ``--reps`` times with and without ``TrainperfCallback``, alternating
(A B A B ...) so that machine load drifts hit both arms alike. A bare timing callback, present in both
arms, records the wall time between consecutive step ends; each run's figure is the median step
interval (the first 5 steps dropped). Reported per framework:

* ``ratio``: median over reps of (with / without) median step time - 1 (the side-by-side overhead);
* ``hooks_fraction``: the callback's own accounting: perf_counter time inside trainperf's hooks per
  step / mean step time (summary.json ``monitor_overhead``), which machine noise does not blur.

Run: ``python benchmarks/integration_overhead.py [--steps 60 --reps 5] [--json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

SEQ, VOCAB, BATCH = 128, 512, 8


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int, as_dict: bool):
        self.rows = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))
        self.as_dict = as_dict

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return {"input_ids": r, "labels": r.clone()} if self.as_dict else r


def _median_interval(ends: list[float]) -> float:
    gaps = [b - a for a, b in zip(ends, ends[1:])][5:]
    return statistics.median(gaps)


def hf_run(steps: int, with_cb: bool, out: Path) -> tuple[float, float | None]:
    import transformers

    from trainperf.integrations.hf import TrainperfCallback

    ends: list[float] = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=SEQ)
    model = transformers.AutoModelForCausalLM.from_config(config)
    args = transformers.TrainingArguments(output_dir=str(out / "hf"), max_steps=steps, per_device_train_batch_size=BATCH,
                                          report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                                          disable_tqdm=True, dataloader_num_workers=0)
    cbs = [Clock()]
    tp = TrainperfCallback(run_dir=out / "run") if with_cb else None
    if tp:
        cbs.append(tp)
    transformers.Trainer(model=model, args=args, train_dataset=Rows(steps * BATCH, True), callbacks=cbs).train()
    hooks = tp.summary["monitor_overhead"]["fraction_of_step"] if tp else None
    return _median_interval(ends), hooks


def lightning_run(steps: int, with_cb: bool, out: Path) -> tuple[float, float | None]:
    import lightning.pytorch as L

    from trainperf.integrations.lightning import TrainperfCallback

    ends: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *a, **kw):
            ends.append(time.perf_counter())

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(VOCAB, 128)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 128),
                                           torch.nn.Linear(128, VOCAB))

        def training_step(self, batch, i):
            logits = self.mlp(self.emb(batch[:, :-1]))
            return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    cbs = [Clock()]
    tp = TrainperfCallback(run_dir=out / "run") if with_cb else None
    if tp:
        cbs.append(tp)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=cbs, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LM(), torch.utils.data.DataLoader(Rows(steps * BATCH, False), batch_size=BATCH))
    hooks = tp.summary["monitor_overhead"]["fraction_of_step"] if tp else None
    return _median_interval(ends), hooks


def measure(fn, steps: int, reps: int) -> dict:
    import contextlib

    ratios, hooks, with_s, without_s = [], [], [], []
    # the frameworks print their own summaries: keep stdout for this script's result
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(sys.stderr):
        fn(10, True, Path(d) / "warm")  # imports, peak measurement, allocator warm-up
        for r in range(reps):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {}
            for flag in order:
                got[flag] = fn(steps, flag, Path(d) / f"r{r}{flag}")
            ratios.append(got[True][0] / got[False][0] - 1)
            hooks.append(got[True][1])
            with_s.append(got[True][0])
            without_s.append(got[False][0])
    return {"ratio": statistics.median(ratios), "ratios": ratios, "hooks_fraction": statistics.median(hooks),
            "step_s_with": statistics.median(with_s), "step_s_without": statistics.median(without_s)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    res = {"hf_trainer": measure(hf_run, a.steps, a.reps), "lightning": measure(lightning_run, a.steps, a.reps),
           "settings": {"steps": a.steps, "reps": a.reps, "threads": 1, "batch": BATCH, "seq": SEQ},
           "command": "python benchmarks/integration_overhead.py " + " ".join(sys.argv[1:])}
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    for k in ("hf_trainer", "lightning"):
        r = res[k]
        print(f"{k:<11} step {1000 * r['step_s_without']:.1f} ms without, {1000 * r['step_s_with']:.1f} ms with the "
              f"callback: side by side {100 * r['ratio']:+.2f}% (reps {', '.join(f'{100 * x:+.1f}%' for x in r['ratios'])}); "
              f"inside the hooks {100 * r['hooks_fraction']:.3f}% of a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
