"""The balancer across 2 gloo processes: exact gradients with uneven shares (DDP and FSDP2), shared
decisions, and the straggler bench's worker (small).

Each worker is this file run as a script (``--worker``); it writes its findings as JSON and the
test reads them; the ranks meet through file stores in the test's temporary folder. One pair of
processes does all of it: starting one costs ~10 s here (torch, and
DDP's import of torch._dynamo). Gradient tolerance (fp32): every gradient within ``rtol=1e-5, atol=1e-7`` of the
single-process gradient of the same global batch (only the summation order differs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest

GLOBAL_BATCH, SEQ = 16, 8
RTOL, ATOL = 1e-5, 1e-7
# ~5 s on an idle 2-core machine; a collective that waits longer than COLLECTIVE_TIMEOUT_S fails the
# worker with a message instead of hanging, and the fixture stops the workers after FIXTURE_TIMEOUT_S.
COLLECTIVE_TIMEOUT_S, FIXTURE_TIMEOUT_S = 90, 240
# name -> (shares, micro_steps, scaled): scaled=False is the naive per-rank mean, which must be wrong
CASES = {
    "ddp_equal": ([8, 8], 2, True),
    "ddp_uneven": ([11, 5], 2, True),
    "ddp_very_uneven": ([13, 3], 3, True),
    "ddp_naive_mean": ([11, 5], 2, False),
    "fsdp2_uneven": ([11, 5], 2, True),
}


def _model():
    import torch

    from trainperf.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=SEQ, vocab_size=64))
    model.init_weights()
    return model


def _grads_of_reference(x, y) -> dict:
    model = _model()
    _, loss = model(x, y)  # mean over the whole global batch: the gradient to match
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _run_case(name, shares, micro_steps, scaled, rank, world, x, y):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainperf.data.sampler import GlobalBatchSampler
    from trainperf.distributed.balance import micro_batch_sizes, micro_loss_scale

    model = _model()
    fsdp = name.startswith("fsdp2")
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    else:
        wrapped = DDP(model)
    sampler = GlobalBatchSampler(GLOBAL_BATCH, GLOBAL_BATCH, rank=rank, world=world, shuffle=False)
    idx = torch.as_tensor(sampler.next_local(shares))
    sizes = micro_batch_sizes(len(idx), micro_steps)
    start = 0
    for i, n in enumerate(sizes):
        last = i == len(sizes) - 1
        part = idx[start:start + n]
        start += n
        if fsdp:
            wrapped.set_requires_gradient_sync(last)
            ctx = nullcontext()
        else:
            ctx = nullcontext() if last else wrapped.no_sync()
        with ctx:
            _, loss = wrapped(x[part], y[part])  # mean over this micro-batch
            scale = micro_loss_scale(n, GLOBAL_BATCH, world) if scaled else 1 / micro_steps
            (loss * scale).backward()
    out = {}
    for n, p in model.named_parameters():
        g = p.grad
        out[n.replace("_fsdp_wrapped_module.", "")] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


def _balancer_run(rank):
    """Real all_gather: rank 1 reports 2x the compute per sample from step 30; both ranks must agree."""
    from trainperf.distributed.balance import DynamicBalancer

    bal = DynamicBalancer(48, sync_every=2, window=10, min_steps=4)
    trace = []
    for step in range(80):
        per_sample = 2e-3 if (rank == 1 and step >= 30) else 1e-3
        bal.step(step, bal.local_share * per_sample)
        trace.append(bal.shares)
    return {"trace": trace, "decisions": [d.as_dict() for d in bal.decisions]}


# seq 64: the per-sample compute well above the share-independent time (optimizer, data), so that the 3x rank
# is worth a move by the policy's own cost model even when a busy machine inflates that fixed time (at seq 16
# the policy once judged, rightly, that no move paid within the 30 settle steps); 45 settle steps: a busy machine
# delays the first decision
BENCH_ARGS = dict(ranks=2, slow_rank=1, slowdown=3.0, steps=6, block=3, global_batch=24, micro_steps=2, seq=64, dim=64,
                  window=10, min_steps=4, threshold=0.2, min_gain=0.02, sync_every=2, settle_steps=45, pin=False,
                  verify=True, verify_steps=3, verify_block=2, backoff_steps=100, timeout_s=COLLECTIVE_TIMEOUT_S)


def _say(rank: int, what: str) -> None:
    print(f"rank {rank}: {what}", flush=True)  # the fixture shows these lines if a worker fails or hangs


def worker(rank: int, world: int, out: str) -> None:
    import time
    from datetime import timedelta

    t0 = time.perf_counter()
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.dump_traceback_later(COLLECTIVE_TIMEOUT_S)  # where a hung worker waits, in its log
    torch.set_num_threads(1)
    # File stores, not TCP ports: a port picked free by the fixture can be taken (or self-connected
    # to by a retrying client) before rank 0 listens, and the ranks then wait for each other.
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'store-cases')}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    _say(rank, f"process group up after {time.perf_counter() - t0:.1f} s")
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (GLOBAL_BATCH, SEQ + 1), generator=g)
    x, y = data[:, :-1], data[:, 1:]
    ref = _grads_of_reference(x, y)
    result = {"cases": {}, "timings": {"setup": time.perf_counter() - t0}}
    for name, (shares, k, scaled) in CASES.items():
        try:
            grads = _run_case(name, shares, k, scaled, rank, world, x, y)
        except Exception as exc:  # reported, the test decides
            result["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        worst = max(((grads[n] - r).abs() - RTOL * r.abs()).max().item() for n, r in ref.items())
        maxdiff = max((grads[n] - r).abs().max().item() for n, r in ref.items())
        result["timings"][name] = time.perf_counter() - t0
        _say(rank, f"case {name} done at {result['timings'][name]:.1f} s")
        result["cases"][name] = {"ok": worst <= ATOL, "max_abs_diff": maxdiff,
                                 "max_grad": max(r.abs().max().item() for r in ref.values())}
    result["balancer"] = _balancer_run(rank)
    result["timings"]["balancer"] = time.perf_counter() - t0
    from trainperf.distributed.init import destroy_distributed

    destroy_distributed(barrier=True)  # the cases' DDP / FSDP models are gone (their functions returned)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))

    _say(rank, "balancer done; bench worker next")

    from trainperf.bench.balance import _worker as bench_worker

    bench_worker(rank, world, f"file://{Path(out, 'store-bench')}", BENCH_ARGS, str(Path(out, "bench.json")))  # rank 0 writes
    _say(rank, f"bench worker done at {time.perf_counter() - t0:.1f} s")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("balance")
    world = 2
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    logs = [out / f"rank{r}.log" for r in range(world)]
    procs = []
    for r in range(world):
        with logs[r].open("w") as log:  # the child keeps its own copy of the handle
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(world), str(out)], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + FIXTURE_TIMEOUT_S
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        pytest.fail(f"the balance workers did not finish in {FIXTURE_TIMEOUT_S} s; their output:\n"
                    + "\n".join(f"--- rank {r}\n{log.read_text()[-3000:]}" for r, log in enumerate(logs)))
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log.read_text()[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return ranks + [json.loads((out / "bench.json").read_text())]


@pytest.mark.distributed
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][2]])
def test_uneven_shares_give_the_global_batch_gradient(results, case):
    for res in results[:2]:
        r = res["cases"][case]
        assert "error" not in r, r
        assert r["ok"], f"{case}: max |grad diff| {r['max_abs_diff']:.3g} (largest grad {r['max_grad']:.3g})"


@pytest.mark.distributed
def test_naive_per_rank_mean_is_wrong_with_uneven_shares(results):
    """The control: averaging per-rank means (the plain DDP way) with shares 11/5 is measurably off."""
    r = results[0]["cases"]["ddp_naive_mean"]
    assert not r["ok"] and r["max_abs_diff"] > 100 * ATOL


@pytest.mark.distributed
def test_ranks_take_identical_decisions_and_follow_the_slowdown(results):
    t0, t1 = results[0]["balancer"]["trace"], results[1]["balancer"]["trace"]
    assert t0 == t1  # same shares on every rank at every step
    assert t0[29] == [24, 24] and t0[-1] == [32, 16]
    d = results[0]["balancer"]["decisions"]
    assert len(d) == 1 and d[0]["step"] > 30 and d[0]["speeds"][0] > 1.8 * d[0]["speeds"][1]




@pytest.mark.distributed
def test_bench_worker_moves_samples_off_the_slow_rank(results):
    """The bench's measurement on real compute: rank 1 does 3x the work per sample. Timings on a shared
    machine are noisy, so this asserts what the measured compute must show, not a speed-up figure."""
    res = results[2]
    for key in ("ideal_step_s", "unbalanced_step_s", "balanced_step_s", "shares", "balanced_vs_ideal",
                "unbalanced_vs_ideal", "per_sample_s", "decisions", "overhead_s", "balanced_slowest_compute_s",
                "per_sample_median_s", "ideal_from_medians_step_s", "settled_shares"):
        assert key in res
    assert sum(res["shares"]) == 24
    assert res["per_sample_s"][1] > 1.3 * res["per_sample_s"][0]  # 3x the work is measured as slower
    assert res["decisions"], {k: res.get(k) for k in ("per_sample_s", "compute_s", "overhead_s", "settle_steps")}
    d = res["decisions"][0]
    assert d["old_shares"] == [12, 12] and d["new_shares"][1] < d["new_shares"][0]  # a move off the slow rank
    # tried against the old shares: kept or reverted on the measured step time (a busy machine's noise over
    # 3 steps per arm may hide the gain; the rules are tested on scripted timings in test_balance_verify.py)
    assert 0 < res["ideal_step_s"] <= min(res["unbalanced_step_s"], res["balanced_step_s"])
    if not res["verdicts"]:
        # a busy machine made the policy decide only after the settle steps, in the measured blocks (where it
        # stays on, as in training): its trial was still running when they ended; never a trial cut short
        # inside the settle phase, which runs on until a trial started there is judged
        assert len(res["decisions"]) == 1 and d["step"] >= res["settle_steps"], (res["decisions"], res["settle_steps"])
        return
    v = res["verdicts"][0]
    assert v["new_shares"] == d["new_shares"] and v["shares"] == (d["new_shares"] if v["verdict"] == "kept" else [12, 12])
    if len(res["decisions"]) == 1 and len(res["verdicts"]) == 1:
        assert res["shares"] == v["shares"]  # the verdict's shares are the ones that ran on


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
