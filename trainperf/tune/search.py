"""The search: coordinate descent over the dimensions of :mod:`trainperf.tune.space`.

    default trial -> for each dimension (surest gains first: :func:`order.plan`), around the best so
    far: each option, fastest-first, is resolved (a config error fails it), estimated (pruned
    when it does not fit; a micro-batch that does not fit is paired with the least recompute
    that does), checked against the time left, then measured (:func:`trial.run_trial`) ->
    the default and the best measured side by side -> the choice, the tuned YAML, the files

Unpaired (the CUDA path), a candidate replaces the best when its tokens/s beats the best's by
``min_gain`` (noise guard). On a CPU (``Options.paired``) each trial runs in its own process, interleaved with the best's
live one (:class:`trial.Paired`), and replaces it when it is *faster* by :mod:`trainperf.tune.stats`
(median ratio above 1 and a one-sided Wilcoxon signed-rank p below 5%); a trial without
a verdict after ``trial_rounds`` rounds takes more, up to ``trial_max_rounds``.
The choice is never a failed candidate, and never one slower than the default in the final
side-by-side measurement (it must be *faster* by :mod:`trainperf.tune.stats` over the rounds):
the best, then up to ``confirm - 1`` runners-up, are measured so; when none wins the default is kept
and the notes say why. When no time is left for the measurement, a best adopted by paired trials is
kept on that chain of paired wins (named in the notes, no speed-up claimed) and an unpaired one is not.
A paired trial's extra rounds stop short of the final's reserve. A KeyboardInterrupt stops
the search and keeps the best so far (written out, not confirmed side by side; ``interrupted``
is set).

Time budget: a trial starts only when the time left covers its expected cost plus the final
side-by-side's. Expected costs come from the trials so far (a compile trial adds the longest
compilation seen, or ``compile_prior_s`` before the first one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

from trainperf.train.resolve import resolve
from trainperf.config.schema import Config
from trainperf.errors import UserError
from trainperf.tune import order, space, stats
from trainperf.tune.fit import Estimator
from trainperf.tune.result import Side, TrialLog, TrialRecord, TuneResult, write_outputs
from trainperf.tune.trial import Paired, group_side_by_side, prime, run_group_trial, run_trial, side_by_side


WRITE_S = 2.0  # kept back from the budget for writing the results
SAFETY = 1.25  # a trial starts when the time left covers this x its expected cost + the final measurement's


@dataclass
class Options:
    budget_s: float = 600.0
    warmup: int = 2  # untimed steps after the first one
    steps: int = 5  # timed steps per trial
    rounds: int = 6  # final side-by-side: rounds x round_steps steps of each
    round_steps: int = 3  # per round and side: the median of 3 drops the step that pays for the switch
    min_gain: float = 0.02
    confirm: int = 3  # candidates measured side by side at most (the best, then runners-up)
    runner_up: float = 0.05  # a runner-up's trial within this fraction of the default's tokens/s
    paired: bool | None = None  # trials interleaved with the best (None: on a CPU; see trial.Paired)
    max_rounds: int = 60  # paired final measurement: more rounds while the budget lasts (a fixed plan, no peeking)
    trial_rounds: int = 4  # paired trials: rounds x round_steps steps of the candidate and of the best
    trial_max_rounds: int = 16  # ... and more, up to this, while the rounds give no verdict (tune/stats.py)
    compile_prior_s: float = 60.0
    nproc: int = 1  # ranks per trial on this machine (--nproc-per-node): each trial is a group launched as torchrun would
    progress: bool = True


def _error_status(exc: BaseException) -> tuple[str, str]:
    kind = getattr(exc, "kind", None) or type(exc).__name__  # a trial worker's error keeps its type's name
    text = f"{kind}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    oom = kind == "OutOfMemoryError" or "out of memory" in str(exc).lower()
    return ("oom" if oom else "failed"), text


class _Search:
    def __init__(self, user_cfg: Config, out_dir: Path, opts: Options, facts, clock, trial_fn, sbs_fn, start):
        self.user, self.opts, self.clock = user_cfg, opts, clock
        self.trial_fn, self.sbs_fn = trial_fn, sbs_fn
        self.start = start
        self.out_dir = out_dir
        self.log = TrialLog(out_dir / "trials.jsonl")
        self.estimate = Estimator()
        self.nproc = opts.nproc
        default = self.resolved({})
        self.global_batch = default.train.global_batch
        self.facts = facts or space.Facts.probe(default.run.device, self.nproc)
        self.default_settings = space.settings_of(default)
        self.trials: list[TrialRecord] = []
        self.tried: set[str] = set()
        self.default: TrialRecord | None = None
        self.best: TrialRecord | None = None
        self.bar = None
        self.prime = None  # run once before the default trial (see tune())
        self.paired = None  # trial.Paired on a CPU (see tune())
        self.order: list[order.Step] = []  # the dimensions in the order searched (plan())
        self.expected: str | None = None  # the current dimension's place in that order, and why

    # ---------------------------------------------------------------- configs
    def resolved(self, settings: space.Settings) -> Config:
        """The candidate as it trains (resolved), run in the tune directory, without a progress bar."""
        cfg = space.apply(self.user, {**settings, "run.progress": False, "run.dir": str(self.out_dir / "trial")})
        return resolve(cfg, self.device_facts(), world_size=self.nproc).cfg

    def device_facts(self):
        """This machine, with ``nproc`` ranks on it (threads and loader workers are shared among them)."""
        from dataclasses import replace

        from trainperf.config.resolve import DeviceFacts

        if not hasattr(self, "_device_facts"):
            self._device_facts = replace(DeviceFacts.probe(), local_ranks=self.nproc)
        return self._device_facts

    def deadline_monotonic(self) -> float:
        """The budget's end on ``time.monotonic`` (the clock the side-by-side reads)."""
        return time.monotonic() + self.left() - WRITE_S

    def better(self, rec: TrialRecord) -> bool:
        if rec.vs_best is not None:
            return rec.vs_best > 1 and rec.p_faster is not None and rec.p_faster < stats.P
        return rec.tokens_per_s > self.best.tokens_per_s * (1 + self.opts.min_gain)

    def slower(self, rec: TrialRecord, ref: TrialRecord) -> bool:
        if rec.vs_best is not None:
            return rec.vs_best < 1 - 2 * self.opts.min_gain
        return rec.tokens_per_s < ref.tokens_per_s * (1 - 2 * self.opts.min_gain)

    def left(self) -> float:
        return self.opts.budget_s - (self.clock() - self.start)

    # ---------------------------------------------------------------- costs
    def trial_cost(self, settings: space.Settings) -> float:
        done = [t for t in self.trials if t.status == "ok" and t.elapsed_s is not None]
        plain = [t.elapsed_s - (t.first_step_s or 0) for t in done]
        base = sum(plain) / len(plain) if plain else 0.0
        first = [t.first_step_s for t in done if t.settings.get("compile.enabled")]
        if settings.get("compile.enabled"):
            return base + (max(first) if first else self.opts.compile_prior_s)
        return base + max([t.first_step_s for t in done if not t.settings.get("compile.enabled")] or [0.0])

    def final_cost(self, cand: TrialRecord | None = None, as_if: bool = False) -> float:
        """The side-by-side of the default and ``cand`` (default: the best): two builds and first
        steps, then the steps; nothing when the best is the default, unless ``as_if`` (the final a trial
        that wins would need: its cost taken as the best's)."""
        cand = cand or self.best
        if cand is None or self.default is None or (cand is self.default and not as_if):
            return 0.0
        n = max(self.opts.rounds, stats.MIN_ROUNDS) * self.opts.round_steps  # the final runs at least MIN_ROUNDS
        if self.paired is not None:  # both trainers are live: the rounds only
            return n * ((self.default.step_s or 0) + (cand.step_s or 0))

        def one(t: TrialRecord) -> float:  # its build, first step and warm-up as in its trial, then the rounds
            warm = t.warm_steps if t.warm_steps is not None else self.opts.warmup
            return (t.build_s or 0) + (t.first_step_s or 0) + (warm + n) * (t.step_s or 0)

        return one(self.default) + one(cand)

    # ---------------------------------------------------------------- one candidate
    def record(self, rec: TrialRecord) -> TrialRecord:
        if rec.dimension != "default":
            rec.expected = self.expected
        self.trials.append(rec)
        self.log.write(rec)
        if self.bar is not None:
            best = self.best.tokens_per_s if self.best else None
            self.bar.set_postfix_str(f"{max(0, self.left()):.0f}s left" + (f", best {best:,.0f} tok/s" if best else ""))
            self.bar.update(1)
        return rec

    def fit_or_pair(self, settings: space.Settings, dim: str) -> tuple[space.Settings, Config | None, str | None, int | None]:
        """(settings, resolved config or None, reason when pruned, estimate): a micro-batch that does
        not fit is paired with the least recompute that does."""
        cfg = self.resolved(settings)
        fit = self.estimate(cfg)
        if fit.fits:
            return settings, cfg, None, fit.bytes
        if dim == "micro_batch":
            for ac in space.CHECKPOINTING[1:]:
                paired = {**settings, **ac}
                cfg2 = self.resolved(paired)
                fit2 = self.estimate(cfg2)
                if fit2.fits:
                    return paired, cfg2, None, fit2.bytes
        return settings, None, fit.reason(), fit.bytes

    def try_option(self, dim: str, change: space.Settings) -> TrialRecord | None:
        base = self.best.settings if self.best else self.default_settings
        settings = {**base, **change}
        try:
            settings, cfg, pruned, est = self.fit_or_pair(settings, dim)
        except UserError as exc:
            return self.record(TrialRecord(settings, "failed", dim, change, reason=f"config: {exc}"))
        if cfg is not None:
            settings = space.settings_of(cfg)
        key = repr(sorted(settings.items()))
        if key in self.tried:
            return None
        self.tried.add(key)
        changed = {k: v for k, v in settings.items() if base.get(k) != v}
        if pruned:
            return self.record(TrialRecord(settings, "pruned", dim, changed, estimate_bytes=est, reason=pruned))
        need, reserve, left = self.trial_cost(settings), self.final_cost(), self.left()
        if left < SAFETY * need + reserve:
            return self.record(TrialRecord(settings, "pruned", dim, changed, estimate_bytes=est,
                                           reason=f"time budget: {left:.0f} s left < this trial's expected {need:.0f} s "
                                                  f"x {SAFETY} + the final side-by-side's {reserve:.0f} s"))
        try:
            if self.paired is not None:  # its extra rounds (no verdict yet) stop short of the final's reserve
                m = self.paired.run(cfg, deadline=self.deadline_monotonic() - self.final_cost(as_if=True))
            else:
                m = self.trial_fn(cfg, global_batch=self.global_batch, warmup=self.opts.warmup, steps=self.opts.steps)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is a result, not a crash
            status, reason = _error_status(exc)
            return self.record(TrialRecord(settings, status, dim, changed, estimate_bytes=est, reason=reason))
        return self.record(_ok(settings, dim, changed, m, est))

    # ---------------------------------------------------------------- the descent
    def run(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc="trainperf tune", unit="trial", leave=False, disable=not self.opts.progress)
        try:
            self.tried.add(repr(sorted(self.default_settings.items())))
            if self.prime is not None:
                try:
                    self.prime(self.resolved({}))
                except Exception:  # noqa: BLE001 - the default trial records why the default cannot run
                    pass
            self.default = self._default_trial()
            if self.default.status == "ok":
                self.best = self.default
            self.order = self.plan()
            for step in self.order:
                current = self.resolved(self.best.settings if self.best else self.default_settings)
                dims = _dims_of(current, self.nproc)
                self.dimension(step.build(current, dims.dp_replicate * dims.dp_shard, _sharded(dims)), step)
        finally:
            self.bar.close()

    def plan(self) -> list[order.Step]:
        """The dimensions, surest gains first (tune/order.py), written to plan.json before any is tried."""
        from trainperf.runio import write_json

        def fit(changes: space.Settings):
            try:
                return self.estimate(self.resolved({**self.default_settings, **changes}))
            except UserError:
                return None

        steps = order.plan(self.resolved(self.default_settings), self.facts, fit)
        write_json(self.out_dir / "plan.json", {"order": [s.as_dict() for s in steps], "method": order.__doc__.split("\n\n")[1]})
        return steps

    def _default_trial(self) -> TrialRecord:
        s = self.default_settings
        try:
            cfg = self.resolved({})
            est = self.estimate(cfg).bytes
            if self.paired is not None:
                m = self.paired.run_default(cfg, steps=self.opts.steps, deadline=self.deadline_monotonic())
            else:
                m = self.trial_fn(cfg, global_batch=self.global_batch, warmup=self.opts.warmup, steps=self.opts.steps)
        except Exception as exc:  # noqa: BLE001
            status, reason = _error_status(exc)
            return self.record(TrialRecord(s, status, reason=f"the default config: {reason}"))
        return self.record(_ok(s, "default", {}, m, est))

    def dimension(self, dim: space.Dimension, step: order.Step | None = None) -> None:
        self.expected = step.label() if step is not None else None
        for settings, reason in dim.rejected:
            base = self.best.settings if self.best else self.default_settings
            self.record(TrialRecord({**base, **settings}, "pruned", dim.name, settings, reason=reason))
        stop: str | None = None
        dim_best: TrialRecord | None = self.best
        for opt in dim.options:
            if stop:
                base = self.best.settings if self.best else self.default_settings
                self.record(TrialRecord({**base, **opt.settings}, "pruned", dim.name, opt.settings, reason=stop))
                continue
            rec = self.try_option(dim.name, opt.settings)
            if rec is None or rec.status != "ok":
                continue
            keep = self.best is None or self.better(rec)
            if self.paired is not None:
                self.paired.adopt(keep)
            if keep:
                self.best = rec
            if dim.stop_after_first_ok:
                stop = (f"recomputes more than {space.label(rec.changed) or 'the current mode'}, which fits and ran: "
                        "not faster at this micro-batch")
            elif dim.stop_when_slower and dim_best is not None and self.slower(rec, dim_best):
                stop = (f"{space.label(rec.changed)} was already clearly slower than the best micro-batch: "
                        "smaller ones are assumed slower still")
            if dim_best is None or rec is self.best or (rec.vs_best is None and rec.tokens_per_s > dim_best.tokens_per_s):
                dim_best = rec

    # ---------------------------------------------------------------- the choice
    def confirm_order(self) -> list[TrialRecord]:
        """Candidates for the side-by-side, in order: the best, then the runners-up whose own trial
        was within ``runner_up`` of the default's (a trial is a few steps on a loaded machine)."""
        d, b = self.default, self.best
        if self.paired is not None:  # trials were judged interleaved with the best: the best alone
            return [b]
        others = [t for t in self.trials if t.status == "ok" and t is not d and t is not b
                  and t.tokens_per_s >= d.tokens_per_s * (1 - self.opts.runner_up)]
        others.sort(key=lambda t: -t.tokens_per_s)
        return ([b] + others)[:self.opts.confirm]

    def finish(self, interrupted: bool, config_path: str | None, doctor: dict | None) -> TuneResult:
        d, b = self.default, self.best
        if b is None and interrupted:
            raise KeyboardInterrupt  # stopped before the default's trial ended: nothing to keep
        if b is None:
            if d is not None and d.reason and "Timeout" in d.reason:
                raise UserError(f"the default config did not finish its first steps within the {self.opts.budget_s:.0f} s "
                                f"budget ({d.reason}): one of its steps takes too long to measure in this budget; raise "
                                "--budget-min, or tune with a smaller train.global_batch or model")
            raise UserError("no candidate ran, the default included: "
                            + "; ".join(f"{t.status}: {t.reason}" for t in self.trials[:3]))
        chosen, sbs, notes, confirmed, unconfirmed = b, None, [], [], False
        if d.status != "ok":
            notes.append(f"the default does not run ({d.reason}); the fastest candidate that ran is chosen "
                         "(no side-by-side baseline)")
        elif not interrupted:
            chosen = d
            for cand in (self.confirm_order() if b is not d else []):
                vs_default = {k: v for k, v in cand.settings.items() if self.default_settings.get(k) != v}
                if self.left() < self.final_cost(cand):
                    notes.append(f"no time left to measure {space.label(vs_default)} side by side "
                                 f"({self.left():.0f} s left, {self.final_cost(cand):.0f} s needed)")
                    if self.paired is not None and cand is b:
                        chosen, unconfirmed = b, True  # adopted by paired tests, each against the best before it
                        notes.append(_chain_note(self.trials, b))
                    break
                try:
                    if self.paired is not None:
                        # live trainers: the time left buys more rounds (a finer estimate), up to max_rounds
                        res = self.paired.final(rounds=max(self.opts.rounds, self.opts.max_rounds),
                                                steps=self.opts.round_steps, deadline=self.deadline_monotonic())
                    else:
                        res = self.sbs_fn(self.resolved(d.settings), self.resolved(cand.settings),
                                          global_batch=self.global_batch, rounds=self.opts.rounds,
                                          steps=self.opts.round_steps, warmup=self.opts.warmup,
                                          deadline=self.deadline_monotonic())
                except KeyboardInterrupt:
                    interrupted = True
                    break
                except Exception as exc:  # noqa: BLE001 - a candidate that fails here is not chosen
                    notes.append(f"{space.label(vs_default)} failed side by side: {_error_status(exc)[1]}")
                    continue
                ratio = res["speedup"]  # the median of the paired per-round ratios
                confirmed.append({"settings": cand.settings, "changes": vs_default, **res, "ratio": ratio})
                sbs = res
                won, rounds = res.get("b_faster_rounds"), res.get("rounds")
                if ratio > 1.0 and ("round_ratios" not in res or stats.faster(res["round_ratios"])):
                    chosen = cand
                    break
                notes.append(f"{space.label(vs_default)} measured x{ratio:.3f} against the default side by side"
                             + (f", faster in {won} of {rounds} rounds" if won is not None else "")
                             + (f" (signed-rank p = {res['p_faster']:.3f})" if res.get("p_faster") is not None else "")
                             + ": not faster, not chosen")
            timed_out = [t for t in self.trials if t.status == "pruned" and (t.reason or "").startswith("time budget")]
            if b is d and not any(t.status == "ok" for t in self.trials if t is not d) and timed_out:
                notes.append(f"no candidate could be measured in the {self.opts.budget_s:.0f} s budget ({len(timed_out)} "
                             "pruned for time: see their reasons): the default is kept; raise --budget-min")
            elif b is d:
                notes.append("no candidate was faster than the default in its trial (paired: a one-sided Wilcoxon signed-rank test over the "
                             f"rounds; unpaired: by the {self.opts.min_gain:.0%} noise margin): the default is kept")
            elif chosen is d and not interrupted and not unconfirmed:
                notes.append("no candidate was faster than the default side by side: the default is kept")
        if interrupted:
            chosen = b
            notes.append("interrupted: the best so far is kept, measured in its own trial, not confirmed side by side")
        speedup = None
        if chosen is d:
            speedup = 1.0  # the reported config is the default itself
        elif sbs is not None and not interrupted:
            speedup = sbs["speedup"]
        default_side = Side(self.default_settings, d.tokens_per_s, d.peak_memory_bytes, d.peak_memory_source, d)
        best_side = Side(chosen.settings, chosen.tokens_per_s, chosen.peak_memory_bytes, chosen.peak_memory_source,
                         chosen)
        if sbs is not None and not interrupted:  # the side-by-side figures, not the trials'
            default_side.tokens_per_s = sbs["a_tokens_per_s"]
            best_side.tokens_per_s = sbs["b_tokens_per_s"] if chosen is not d else sbs["a_tokens_per_s"]
        return self._write(default_side, best_side, speedup, sbs if chosen is not d else None, notes, interrupted,
                           config_path, doctor, confirmed)

    def _write(self, default_side, best_side, speedup, sbs, notes, interrupted, config_path, doctor,
               confirmed) -> TuneResult:
        from trainperf.config.load import dump_yaml

        from trainperf import interrupt
        from trainperf.runio import atomic_write_text

        changes = {k: v for k, v in best_side.settings.items() if self.default_settings.get(k) != v}
        text = dump_yaml(space.apply(self.user, changes))
        path = _tuned_path(config_path, self.out_dir)
        with interrupt.deferred():  # the files are written whole: a signal now is delivered after them
            kept = keep_previous(path, text)
            if kept:
                notes = [*notes, f"replaced the existing {path}; its previous content is kept in {kept}"]
            atomic_write_text(path, text)
            _check_loads(path)
            res = TuneResult(default_side, best_side, path, speedup, self.trials, self.opts.budget_s,
                             self.clock() - self.start, str(self.out_dir), notes, sbs, interrupted, confirmed,
                             [s.as_dict() for s in self.order])
            res.kept_previous = kept
            write_outputs(res, text, doctor)
        return res


def _chain_note(trials: list[TrialRecord], best: TrialRecord) -> str:
    """Why a best not confirmed against the default is kept: the paired trials that adopted it, each
    faster than the best before it by a one-sided signed-rank test."""
    chain = [t for t in trials[:trials.index(best) + 1] if t.status == "ok" and t.vs_best is not None
             and t.vs_best > 1 and t.p_faster is not None and t.p_faster < stats.P]
    steps = "; ".join(f"{space.label(t.changed)}: x{t.vs_best:.3f} ({t.rounds_won} rounds, p={t.p_faster:.3f})" for t in chain)
    return ("the best is kept on its paired trials, each measured interleaved with the best before it and "
            f"adopted as faster ({steps}); its speed-up against the default is not measured")


def _ok(settings, dim, changed, m, est) -> TrialRecord:
    rec = TrialRecord(settings, "ok", dim, changed, m.tokens_per_s, m.step_s, m.peak_memory_bytes, m.peak_memory_source,
                      est, m.first_step_s, m.elapsed_s, m.build_s, m.warm_steps)
    rec.minor_faults_per_step = m.notes.get("minor_faults_per_step")
    if m.paired is not None:
        rec.vs_best, rec.rounds_won = m.paired["speedup"], f"{m.paired['b_faster_rounds']}/{m.paired['rounds']}"
        rec.p_faster = m.paired["p_faster"]
    if m.peak_memory_bytes is None:
        rec.peak_memory_bytes, rec.peak_memory_source = est, "memory estimate (not measured)"
    return rec


def _dims_of(cfg: Config, world_size: int = 1):
    from trainperf.distributed.parallel_dims import ParallelDims

    return ParallelDims.from_config(cfg, world_size)


def _sharded(dims) -> bool:
    return bool(dims.fsdp_enabled or dims.tp_enabled or dims.pp_enabled)


def _tuned_path(config_path: str | None, out_dir: Path) -> str:
    if not config_path:
        return str(out_dir / "tuned.yaml")
    p = Path(config_path)
    return str(p.with_name(f"{p.stem}.tuned{p.suffix or '.yaml'}"))


def keep_previous(path: str, text: str) -> str | None:
    """Before the tuned YAML replaces a file that holds something else (a hand-edited or an earlier tuned
    config), copy it to the first free ``PATH.bak``, ``PATH.bak2``, ...; returns the copy's path, or None when
    there was nothing to keep (no file, or the same text). Never replaces an existing copy."""
    import shutil

    from trainperf.errors import UserError

    p = Path(path)
    if not p.exists():
        return None
    try:
        if p.is_file() and p.read_text(encoding="utf-8", errors="replace") == text:
            return None
        n = 1
        while (dest := p.with_name(p.name + (".bak" if n == 1 else f".bak{n}"))).exists():
            n += 1
        shutil.copy2(p, dest)
    except OSError as exc:
        raise UserError(f"the tuned config {path} exists and could not be kept before it is replaced "
                        f"({exc.strerror or exc}); move it away or make its directory writable") from exc
    return str(dest)


def _check_loads(path: str) -> None:
    """The tuned YAML is a config like any other: it loads and resolves."""
    from trainperf.config.load import load_config

    resolve(load_config(path), world_size=1)


def default_dir(config_path: str | None, cfg: Config) -> Path:
    name = Path(config_path).stem if config_path else cfg.run.name
    return Path("runs") / f"tune-{name}"


def tune(cfg: Config, *, config_path: str | None = None, out_dir: str | Path | None = None,
         options: Options | None = None, doctor: dict | Callable[[], dict] | None = None, facts: space.Facts | None = None,
         clock: Callable[[], float] = time.monotonic, trial_fn=run_trial, sbs_fn=side_by_side,
         paired: Paired | None = None) -> TuneResult:
    """Search ``cfg``'s settings (see the module doc). ``config_path`` names the input YAML (the
    tuned one is written beside it); ``doctor`` (or a function returning it) is saved as the
    machine's description. ``clock``, ``trial_fn``, ``sbs_fn`` and ``paired`` (anything with
    :class:`Paired`'s methods) are a test's injected runners."""
    from trainperf.config.resolve import world_size_from_env

    if world_size_from_env() > 1:
        raise UserError("trainperf tune launches the ranks of each trial itself: run it without torchrun "
                        "(WORLD_SIZE is set), with --nproc-per-node N for N ranks per trial")
    start = clock()
    opts = options or Options()
    if opts.budget_s <= 0:
        raise UserError(f"--budget-min must be positive (got {opts.budget_s / 60:g} minutes)")
    if opts.nproc < 1:
        raise UserError(f"--nproc-per-node must be >= 1 (got {opts.nproc})")
    if callable(doctor):  # computed once the arguments are known good (probing the machine takes seconds)
        doctor = doctor()
    out = Path(out_dir) if out_dir else default_dir(config_path, cfg)
    search = _Search(cfg, out, opts, facts, clock, trial_fn, sbs_fn, start)
    real = trial_fn is run_trial  # not a test's injected runner
    if real and opts.nproc > 1:  # a group of ranks per trial (unpaired, the CUDA path: one group at a time)
        search.trial_fn = partial(run_group_trial, nproc=opts.nproc)
        search.sbs_fn = partial(group_side_by_side, nproc=opts.nproc)
    if real and search.facts.device == "cpu":
        if opts.paired is False:
            if opts.nproc == 1:
                search.prime = prime  # one-time allocations (libraries, thread pools) out of the first trial's peak RSS
        else:  # each trial in its own worker process (or group): its peak RSS is its own
            search.paired = Paired(global_batch=search.global_batch, warmup=opts.warmup, rounds=opts.trial_rounds,
                                   steps=opts.round_steps, max_rounds=opts.trial_max_rounds,
                                   margin=opts.min_gain, nproc=opts.nproc)
    if paired is not None:
        search.paired = paired
    interrupted = False
    try:
        try:
            search.run()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (trainperf.interrupt.Terminated): keep the best so far
            interrupted = True
        return search.finish(interrupted, config_path, doctor)
    finally:
        from trainperf.tune.trial import close_all

        if search.paired is not None:
            search.paired.close()
        close_all()  # any worker started when the interrupt came, before a caller held it
