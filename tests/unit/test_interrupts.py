"""Ctrl-C and SIGTERM at any moment of every long command, with a CPU hog beside it.

Each case starts a command in its own process group, waits for a moment of its life (start-up, a
trial finished, a checkpoint written, its worker processes up) plus a seeded random delay, then
sends SIGINT to the whole group (what a terminal's Ctrl-C does) or SIGTERM to it (``parent:`` cases: SIGTERM
to the command's process alone, as ``kill PID`` or a job scheduler sends it), and checks:
the exit code is 128 + the signal (130 / 143), no process printed a traceback (stdout and stderr
of the command and of every process it started: they share them), no process it started is left
(every descendant seen while it ran, torchrun's ranks in their own sessions included, and the
process group), and what should be kept is kept (tune's best so far, train's last checkpoint).

``TRAINPERF_INTERRUPT_SEEDS=0,1,2,...`` runs every case at more moments (the stress runs; one seed
by default, so that the suite stays short on a 2-core CI machine).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import TINY
from trainperf import interrupt

REPO = Path(__file__).resolve().parents[2]
SEEDS = [int(s) for s in os.environ.get("TRAINPERF_INTERRUPT_SEEDS", "0").split(",") if s.strip()]
BAD = ("Traceback", "Exception ignored", "leaked shared_memory", "Error in atexit")

TUNE = TINY + ["data.source=synthetic", "monitor.jsonl=false"]
POORLY_SET = str(REPO / "configs" / "gpt-tiny-poorly-set.yaml")
TRAIN = TINY + ["run.steps=100000", "checkpoint.every=3", "checkpoint.keep=2", "run.log_every=5"]


@pytest.fixture(scope="module")
def hog():
    """A busy loop beside the command (the loaded machine users press Ctrl-C on); it ignores Ctrl-C
    itself, as the command's own workers must."""
    with interrupt.starting():
        p = subprocess.Popen([sys.executable, "-c", interrupt.HOG_CODE])
    yield p
    p.kill()
    p.wait()


class Family:
    """Every process started under ``pid`` while it runs (polled), and its process group."""

    def __init__(self, pid: int):
        import psutil

        self.root, self.seen, self.stop = psutil.Process(pid), {}, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        import psutil

        while not self.stop.is_set():
            try:
                for c in self.root.children(recursive=True):
                    self.seen.setdefault(c.pid, c)
            except psutil.Error:
                pass
            self.stop.wait(0.05)

    def alive(self) -> list[str]:
        return [f"{p.pid} {p.name()}" for p in self.procs() if p.is_running() and p.status() != "zombie"]

    def procs(self) -> list:
        return list(self.seen.values())

    def count(self) -> int:
        return sum(1 for p in self.procs() if p.is_running())

    def left_behind(self, timeout: float = 20.0) -> list[str]:
        import psutil

        self.stop.set()
        self.thread.join()
        _, alive = psutil.wait_procs(self.procs(), timeout=timeout)
        group = []
        for p in psutil.process_iter(["pid", "name"]):
            try:
                if p.pid != os.getpid() and os.getpgid(p.pid) == self.root.pid and p.status() != "zombie":
                    group.append(f"{p.pid} {p.info['name']} (process group)")
            except (OSError, psutil.Error):
                pass
        out = []
        for p in alive:
            try:
                out.append(f"{p.pid} {p.name()} {' '.join(p.cmdline()[:4])}")
            except psutil.Error:
                pass
        return out + group


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # the line being written
    return out


def _checkpoints(d: Path) -> int:
    if not d.is_dir():
        return 0
    return len(list(d.glob("step-*.json"))) + len(list(d.glob("step-*/COMPLETE")))


# ---------------------------------------------------------------------- the cases, as data
def _tune_args(out: Path, budget_min: float, config: str | None = None) -> list[str]:
    args = ["tune", config or str(out / "tiny.yaml"), "--budget-min", str(budget_min), "--out", str(out / "tune")]
    for kv in (TUNE if config is None else ["data.source=synthetic", "monitor.jsonl=false", "run.threads=1"]):
        args += ["--set", kv]
    return args


def _train_args(corpus: str, out: Path, *extra: str) -> list[str]:
    args = ["train", str(out / "tiny.yaml"), "--resume", "never"]
    for kv in TRAIN + [f"data.path={corpus}", "data.prepare_from=null", f"run.dir={out / 'run'}", *extra]:
        args += ["--set", kv]
    return args


def _launch_args(corpus: str, out: Path) -> list[str]:
    return ["launch", "--nproc-per-node", "2", *_train_args(corpus, out)[1:]]


def _last_dimension(out: Path) -> str | None:
    """The search's last dimension (tune writes its order to plan.json before the first one)."""
    try:
        return json.loads((out / "tune" / "plan.json").read_text())["order"][-1]["dimension"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


# name -> (args(corpus, out), moment, (lo, hi) random delay after it, signal)
# moments: "start" (the command's handlers are installed), "workers:N" (N processes under it), "trials:N" (N trial records),
# "confirm" (the search's last dimension recorded: the side-by-side is next), "checkpoint" (one written)
CASES = {
    "tune-start-up": (lambda c, o: _tune_args(o, 2), "start", (0.3, 5.0), signal.SIGTERM),
    "tune-mid-trial": (lambda c, o: _tune_args(o, 2), "trials:1", (0.0, 2.5), signal.SIGINT),
    # each trial a group of 2 ranks (tune --nproc-per-node 2: WorkerGroup, gloo)
    "tune-2-ranks": (lambda c, o: _tune_args(o, 3) + ["--nproc-per-node", "2"], "trials:1", (0.0, 3.0),
                     signal.SIGINT),
    # the poorly set gpt-tiny: its gains are sure, so a confirmation side by side follows the search
    "tune-confirmation": (lambda c, o: _tune_args(o, 1.2, POORLY_SET), "confirm", (0.0, 1.0), signal.SIGTERM),
    "train": (lambda c, o: _train_args(c, o), "checkpoint", (0.0, 1.5), signal.SIGINT),
    "train-hybrid-workers": (lambda c, o: _train_args(c, o, "data.loader=hybrid", "data.num_workers=2"),
                             "checkpoint", (0.0, 1.5), signal.SIGTERM),
    "launch-2-ranks-int": (lambda c, o: _launch_args(c, o), "checkpoint", (0.0, 2.0), signal.SIGINT),
    "launch-2-ranks-term": (lambda c, o: _launch_args(c, o), "checkpoint", (0.0, 2.0), signal.SIGTERM),
    "bench-step": (lambda c, o: ["bench", "step", "--rounds", "200"]
                   + sum((["--set", kv] for kv in TUNE + ["train.micro_batch=8"]), []),
                   "start", (2.0, 8.0), signal.SIGINT),
    "bench-data": (lambda c, o: ["bench", "data", "--samples", "1024", "--latency-ms", "1", "--decode-ms", "0.1",
                                 "--item-kb", "4", "--epochs", "3", "--cache-dir", str(o)],
                   "workers:1", (0.0, 3.0), signal.SIGTERM),
    "bench-balance": (lambda c, o: ["bench", "balance", "--steps", "400", "--settle-steps", "10", "--seq", "32",
                                    "--min-steps", "5", "--window", "10", "--timeout-s", "60"],
                      "workers:2", (0.0, 4.0), signal.SIGINT),
    "bench-comm": (lambda c, o: ["bench", "comm", "--steps", "40"], "workers:2", (0.0, 4.0), signal.SIGTERM),
}
# SIGTERM to the command's process alone (`kill PID`, a job scheduler, `timeout`): its workers get no signal
# of their own, and the command must stop them. "parent:" + a case above: the same, sent to the command alone.
TO_PARENT = ("tune-mid-trial", "tune-2-ranks", "train-hybrid-workers", "launch-2-ranks-term", "bench-data",
             "bench-balance")
CASES.update({f"parent:{n}": (*CASES[n][:3], signal.SIGTERM) for n in TO_PARENT})


def _handles_signals(pid: int) -> bool:
    """The command installed its SIGINT and SIGTERM handlers (``/proc/PID/status``: SigCgt). Before that
    the interpreter itself is starting, with Python's default handlers: no trainperf code has run."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                mask = int(line.split()[1], 16)
                return all(mask >> (int(s) - 1) & 1 for s in interrupt.SIGNALS)
    except (OSError, ValueError):
        pass
    return False


def _reached(moment: str, fam: Family, out: Path) -> bool:
    kind, _, n = moment.partition(":")
    if kind == "start":
        return _handles_signals(fam.root.pid)
    if kind == "workers":
        return fam.count() >= int(n)
    if kind == "trials":
        return sum(r.get("status") == "ok" for r in _records(out / "tune" / "trials.jsonl")) >= int(n)
    if kind == "confirm":
        last = _last_dimension(out)
        recs = _records(out / "tune" / "trials.jsonl")
        return last is not None and bool(recs) and recs[-1].get("dimension") == last
    if kind == "checkpoint":
        return _checkpoints(out / "run" / "checkpoints") >= 1
    raise ValueError(moment)


def run_interrupted(name: str, seed: int, corpus: str, out: Path, *, wait_s: float = 240.0) -> dict:
    """Run case ``name``, interrupt it at its moment + a delay drawn from ``seed``; what happened."""
    make_args, moment, (lo, hi), sig = CASES[name]
    alone = name.startswith("parent:")
    (out / "tiny.yaml").write_text("{}\n")  # tune writes its tuned YAML beside the config: keep it in tmp
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "trainperf", *make_args(corpus, out)], cwd=str(out), env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    fam = Family(p.pid)
    delay = random.Random(f"{name}-{seed}").uniform(lo, hi)
    t0 = time.monotonic()
    reached = None
    try:
        while time.monotonic() - t0 < wait_s and p.poll() is None:
            if _reached(moment, fam, out):
                reached = time.monotonic() - t0
                break
            time.sleep(0.05)
        assert reached is not None, f"{name}: never reached {moment!r} (exit {p.poll()}):\n{_tail(p)}"
        time.sleep(delay)
        assert p.poll() is None, f"{name}: ended before the signal (exit {p.returncode}):\n{_tail(p)}"
        if alone:
            os.kill(p.pid, sig)
        else:
            os.killpg(p.pid, sig)  # what a terminal's Ctrl-C does: every process of the foreground group
        output, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    return {"code": p.returncode, "output": output, "left": fam.left_behind(), "sig": sig,
            "when": f"{moment} at {reached:.1f} s + {delay:.2f} s", "descendants": len(fam.seen)}


def _tail(p) -> str:
    try:
        p.kill()
        return (p.communicate(timeout=10)[0] or "")[-3000:]
    except Exception:  # noqa: BLE001
        return ""


def check_kept(name: str, out: Path) -> None:
    """What the interrupted command must leave behind, valid."""
    name = name.removeprefix("parent:")
    if name.startswith("tune"):
        settings = out / "tune" / "settings.json"
        done = [r for r in _records(out / "tune" / "trials.jsonl") if r.get("status") == "ok"]
        if not done:  # stopped before the default's trial ended: nothing to keep, and nothing half-written
            assert not settings.exists()
            return
        doc = json.loads(settings.read_text())
        from trainperf.config.load import load_config
        from trainperf.train.resolve import resolve

        resolve(load_config(str(out / "tune" / "tuned.yaml")), world_size=1)  # the best so far loads and resolves
        assert doc["interrupted"] is True or name == "tune-confirmation", doc
    elif name.startswith(("train", "launch")):
        ckpt = out / "run" / "checkpoints"
        if name.startswith("launch"):
            from trainperf.distributed.checkpoint import latest

            assert latest(ckpt) is not None, sorted(p.name for p in ckpt.iterdir())
        else:
            from trainperf.train.checkpoint import CheckpointManager

            mgr = CheckpointManager(ckpt)
            step = mgr.steps()[-1]
            mgr.verify_and_load(step)  # size, sha256, weights_only load
            assert not list(ckpt.glob(".step-*.tmp*")), "a temporary checkpoint file was left"


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(CASES))
def test_an_interrupt_at_a_random_moment_is_clean(name, seed, corpus, tmp_path, hog):
    if name.removeprefix("parent:").startswith("launch"):
        pytest.importorskip("torch.distributed.run")
    res = run_interrupted(name, seed, corpus, tmp_path)
    what = f"{name} seed {seed} ({signal.Signals(res['sig']).name} at {res['when']})"
    assert res["code"] == 128 + res["sig"], f"{what}: exit {res['code']}\n{res['output'][-4000:]}"
    bad = [b for b in BAD if b in res["output"]]
    assert not bad, f"{what}: {bad} in the output\n{res['output'][-6000:]}"
    assert not res["left"], f"{what}: left running: {res['left']}"
    check_kept(name, tmp_path)


# ---------------------------------------------------------------------- the worker's side, exactly
def _worker_script(body: str) -> str:
    return ("import sys, time\n"
            "from trainperf.config import load_config\n"
            "from trainperf.train.resolve import resolve\n"
            "from trainperf.tune import trial\n"
            f"cfg = resolve(load_config(None, {TUNE!r}), world_size=1).cfg\n" + body)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before its answer", "after its answer"])
def test_a_worker_whose_parent_closed_the_pipe_exits_quietly(tmp_path, when):
    """The race of issue 23: a trial worker sends its result (or waits for the next request) just as
    its parent closes the pipe; it ends with exit code 0 and prints nothing, in both orders."""
    body = ("w = trial.Worker(cfg, global_batch=cfg.train.global_batch, warmup=1, wait=False)\n"
            + ("w.conn.close()\n" if when == "before its answer" else "w.started(w._recv())\nw.conn.close()\n")
            + "trial._LIVE.discard(w)\nw.proc.join(120)\nprint('exit', w.proc.exitcode, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", _worker_script(body)], capture_output=True, text=True, timeout=200,
                       cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exit 0" in r.stdout and not r.stderr.strip(), (r.stdout, r.stderr[-3000:])


@pytest.mark.slow
def test_ctrl_c_while_workers_start_is_held_until_they_are_registered(tmp_path):
    """A SIGINT that reaches the parent while it starts a worker is delivered once the worker is
    registered (close_all() then stops it), and the worker, started with the signal blocked, never
    raises KeyboardInterrupt itself."""
    body = ("import os, signal\n"
            "from trainperf import interrupt\n"
            "interrupt.install()\n"
            "try:\n"
            "    with interrupt.starting():\n"
            "        os.killpg(0, signal.SIGINT)  # the whole group, this process and the worker to be\n"
            "        w = trial.Worker(cfg, global_batch=cfg.train.global_batch, warmup=1, wait=False)\n"
            "    print('not interrupted', flush=True)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted, live workers:', len(trial._LIVE), flush=True)\n"
            "    trial.close_all()\n"
            "    print('after close_all:', len(trial._LIVE), w.proc.exitcode is not None, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", _worker_script(body)], capture_output=True, text=True, timeout=200,
                       cwd=str(tmp_path), env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    assert "interrupted, live workers: 1" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert "after close_all: 0 True" in r.stdout, (r.stdout, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_signals_after_the_first_are_held_while_stopping_and_the_third_ends_at_once(tmp_path):
    body = ("import os, signal, time\n"
            "from trainperf import interrupt\n"
            "interrupt.install()\n"
            "try:\n"
            "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
            "except KeyboardInterrupt as exc:\n"
            "    print(type(exc).__name__, interrupt.exit_code(exc), flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(0.2)  # the second: noted, the clean-up goes on\n"
            "    print('cleaning up', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGINT); time.sleep(5)  # the third: out now\n"
            "    print('not reached', flush=True)\n")
    r = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.stdout.split() == ["Terminated", "143", "cleaning", "up"], (r.stdout, r.stderr)
    assert r.returncode == 143 and "stopping now" in r.stderr and "Traceback" not in r.stderr


def test_processes_started_after_the_resource_tracker_still_begin_with_the_signals_blocked():
    """CPython's multiprocessing resource tracker unblocks SIGINT and SIGTERM in the thread that started it.
    Started by the first spawned process inside ``interrupt.starting()``, it ended the block for the ranks
    spawned after it: a Ctrl-C while one imported torch printed its KeyboardInterrupt traceback (``bench
    balance`` on a loaded machine). Each child here raises SIGTERM at once: blocked, it exits 0; unblocked,
    it is killed by it (-15)."""
    code = ("import multiprocessing as mp, signal\n"
            "from trainperf import interrupt\n"
            "ctx = mp.get_context('spawn')\n"
            "with interrupt.starting():\n"
            "    ps = [ctx.Process(target=signal.raise_signal, args=(signal.SIGTERM,)) for _ in range(2)]\n"
            "    for p in ps:\n"
            "        p.start()\n"
            "for p in ps:\n"
            "    p.join()\n"
            "print([p.exitcode for p in ps])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[0, 0]", out.stdout + out.stderr[-2000:]
