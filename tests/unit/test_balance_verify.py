"""The balancer tries each move before keeping it: injected timings, no clocks, so these hold on a busy machine.

Each simulated step gives the policy what the ranks would measure under the shares it runs: per-rank
compute (the cost model's input) and per-rank wall time of the step (the verdict's input). The two can
disagree, as on a real host: a rank sharing its core with another process is slow by a time that
does not follow its work, and moving samples off it then does not make the step faster.
"""

from __future__ import annotations

import random

import pytest

from trainperf.distributed.balance import BalanceDecision, BalancePolicy, BalanceVerdict, DynamicBalancer
from trainperf.distributed.balance_trial import Trial, judge, median_se
from trainperf.errors import ConfigError


def drive(pol: BalancePolicy, compute, wall, steps: int, *, noise: float = 0.0, seed: int = 0, start: int = 0):
    """Feed ``steps`` steps: ``compute(shares) -> per-rank s``, ``wall(shares) -> step s`` (every rank sees the
    same wall time, each with its own noise). Returns (shares per step, events)."""
    rng = random.Random(seed)
    trace, events = [], []
    for step in range(start, start + steps):
        shares = list(pol.shares)
        c = [t * (1 + rng.uniform(-noise, noise)) for t in compute(shares)]
        w = wall(shares)
        walls = [w * (1 + rng.uniform(-noise, noise)) for _ in shares]
        trace.append(shares)
        e = pol.update(step, c, None, walls)
        if e is not None:
            events.append(e)
    return trace, events


def per_sample(p):
    return lambda shares: [s * x for s, x in zip(shares, p)]


def model_wall(p, overhead=0.005):
    return lambda shares: max(s * x for s, x in zip(shares, p)) + overhead


# --------------------------------------------------------------------------- the verdict's arithmetic


def test_judge_keeps_a_clear_gain_reverts_a_loss_and_waits_when_unsure():
    old = [0.100, 0.102, 0.098, 0.101, 0.099, 0.100]
    assert judge(old, [v * 0.8 for v in old])[0] == "kept"
    assert judge(old, [v * 1.1 for v in old])[0] == "reverted"
    assert judge(old, old)[0] == "reverted"  # not faster: no move is kept for nothing
    noisy = [0.100, 0.130, 0.080, 0.120, 0.085, 0.110]
    assert judge(noisy, [v * 0.99 for v in noisy])[0] is None  # 1% inside the noise: measure more
    verdict, gain, se = judge(noisy, [v * 0.99 for v in noisy], final=True)
    assert verdict == "reverted" and 0 < gain < se  # at the end: less than one standard error is not evidence
    assert median_se([1.0]) == float("inf") and median_se([1.0, 1.0, 1.0]) == 0.0


def test_a_trial_alternates_new_old_old_new_and_skips_the_first_step_of_each_block():
    t = Trial(old=[32, 32], new=[43, 21], block=2, steps=4, settle=1)
    seen = []
    for i in range(24):
        shares = t.shares
        seen.append(tuple(shares))
        t.record(shares, 1.0 if shares == [43, 21] else 2.0, [1.0, 1.0], [0.0, 0.0])
        verdict = t.advance()
        if verdict:
            break
    new, old = (43, 21), (32, 32)
    assert seen[:12] == [new] * 3 + [old] * 3 + [old] * 3 + [new] * 3  # blocks of 2 + 1 settle step
    assert verdict == "kept" and i == 11 and t.counts() == {"old": 4, "new": 4}  # one round: 2 blocks x 2 per arm


def _run_trial(new_time, old_time, *, steps=10, block=5, seed=0, noise=0.05, limit=400):
    """A trial fed step times (``new_time``/``old_time`` with +-noise): (verdict, steps it took, counts)."""
    rng = random.Random(seed)
    t = Trial(old=[16, 16], new=[21, 11], block=block, steps=steps, max_steps=4 * steps)
    for i in range(limit):
        shares = t.shares
        base = new_time if shares == [21, 11] else old_time
        t.record(shares, base * (1 + rng.uniform(-noise, noise)), [1.0, 1.0], [0.0, 0.0])
        verdict = t.advance()
        if verdict:
            return verdict, i + 1, t.counts()
    return None, limit, t.counts()


def test_the_early_look_keeps_a_clear_gain_and_leaves_a_move_that_measured_no_faster_after_one_round():
    # steps=20: the regular look needs 20 per arm (2 ABBA rounds of blocks of 5 + 1 settle step); the early
    # look comes after the first round (10 per arm, 24 steps)
    verdict, n, counts = _run_trial(0.7, 1.0, steps=20)
    assert verdict == "kept" and n == 24 and counts == {"old": 10, "new": 10}
    for seed in range(10):  # 5% slower: not faster at all, left at the first look
        verdict, n, _ = _run_trial(1.05, 1.0, steps=20, seed=seed)
        assert verdict == "reverted" and n == 24, (seed, verdict, n)
    # a small gain inside the noise is neither kept nor left at the early look: the trial runs on
    verdicts = [_run_trial(0.99, 1.0, steps=20, seed=seed, noise=0.10) for seed in range(10)]
    assert all(n > 24 for v, n, _ in verdicts if v == "kept")
    assert any(n > 24 for _, n, _ in verdicts)


# --------------------------------------------------------------------------- the policy


def test_a_move_that_makes_the_step_slower_is_reverted_and_the_policy_backs_off():
    """Rank 1's compute reads 2x slower, so the model moves samples off it; but the step's wall time is set
    by something else that a move makes worse (a stall on rank 1 plus the extra work on rank 0)."""
    p = [1e-3, 2e-3]
    wall = lambda shares: 0.080 if shares == [32, 32] else 0.090  # noqa: E731 - every other split is slower
    pol = BalancePolicy(64, 2, window=20, min_steps=5, backoff_steps=50)
    trace, events = drive(pol, per_sample(p), wall, 400, noise=0.05, seed=1)
    decisions = [e for e in events if isinstance(e, BalanceDecision)]
    verdicts = [e for e in events if isinstance(e, BalanceVerdict)]
    assert decisions and decisions[0].new_shares[0] > 32 and decisions[0].predicted_gain > 0.2
    assert verdicts and all(v.verdict == "reverted" for v in verdicts)
    assert all(v.shares == [32, 32] and v.measured_gain < 0 for v in verdicts)
    assert pol.shares == [32, 32] and trace[-1] == [32, 32]  # the shares came back
    # the back-off doubles: 50, 100, 200 steps between a revert and the next try
    assert [v.backoff_steps for v in verdicts] == [50 * 2 ** k for k in range(len(verdicts))]
    for v, nxt in zip(verdicts, decisions[1:]):
        assert nxt.step >= v.step + v.backoff_steps
    assert 2 <= len(verdicts) <= 3  # 400 steps: tried, backed off, tried again, backed off longer
    unverified = BalancePolicy(64, 2, window=20, min_steps=5, verify=False)
    trace, _ = drive(unverified, per_sample(p), wall, 400, noise=0.05, seed=1)
    assert trace[-1] != [32, 32]  # the founding document's balancer keeps its loss


def test_a_move_that_pays_is_kept_and_refined_to_the_best_split():
    p = [1e-3, 2e-3]
    pol = BalancePolicy(64, 2, window=20, min_steps=5)
    trace, events = drive(pol, per_sample(p), model_wall(p), 400, noise=0.03, seed=2)
    verdicts = [e for e in events if isinstance(e, BalanceVerdict)]
    assert verdicts[0].verdict == "kept" and verdicts[0].measured_gain > 0.2 and verdicts[0].cause == "per_sample"
    assert abs(pol.shares[0] - 64 * 2 / 3) < 1.5 and pol.settled
    assert pol.verdicts[0].follows[1] == pytest.approx(1.0, abs=0.1)  # rank 1's time followed its work
    best = min(max(a * p[0], (64 - a) * p[1]) for a in range(1, 64))
    assert max(s * x for s, x in zip(pol.shares, p)) <= best * 1.03


def test_a_rank_stalled_regardless_of_work_is_diagnosed_and_left_alone():
    """Rank 1's compute clock reads 70 ms whatever its share (descheduled while it computes): the model
    sees a slow rank and moves samples off it; the trial measures that rank 1's time did not follow
    (cause 'stall') and that the step did not get faster, and goes back."""
    compute = lambda shares: [shares[0] * 1e-3, 0.070]  # noqa: E731
    wall = lambda shares: max(shares[0] * 1e-3, 0.070) + 0.002  # noqa: E731
    pol = BalancePolicy(64, 2, window=20, min_steps=5, backoff_steps=1000)
    trace, events = drive(pol, compute, wall, 200, noise=0.03, seed=3)
    verdicts = [e for e in events if isinstance(e, BalanceVerdict)]
    assert len(verdicts) == 1 and verdicts[0].verdict == "reverted"
    assert verdicts[0].cause == "stall" and abs(verdicts[0].follows[1]) < 0.3
    assert pol.shares == [32, 32]


def test_noise_does_not_keep_a_move_that_changes_nothing():
    """A move the model believes in (rank 1's clock reads 1.6x slower) while the step time does not change:
    with 10% noise per step, the verdict keeps it in at most 2 of 20 seeds, and each kept one within the noise."""
    compute = per_sample([1e-3, 1.6e-3])
    kept = 0
    for seed in range(20):
        pol = BalancePolicy(64, 2, window=20, min_steps=5, backoff_steps=10**6)
        drive(pol, compute, lambda shares: 0.060, 300, noise=0.10, seed=seed)
        assert len(pol.verdicts) == 1
        v = pol.verdicts[0]
        kept += v.verdict == "kept"
        assert v.verdict == "reverted" or v.measured_gain < 0.05
    assert kept <= 2


def test_the_measured_slopes_place_the_refinement():
    """Per-rank costs with an intercept the proportional model does not see (20 ms on rank 0): the first,
    proportional move undershoots; the refinement, from the trial's two-point fit, lands on the best split."""
    cost = [(0.020, 1e-3), (0.0, 2e-3)]  # (intercept, per sample) per rank
    compute = lambda shares: [a + s * b for (a, b), s in zip(cost, shares)]  # noqa: E731
    wall = lambda shares: max(compute(shares)) + 0.002  # noqa: E731
    pol = BalancePolicy(96, 2, window=20, min_steps=5)
    drive(pol, compute, wall, 600, noise=0.01, seed=4)
    assert pol.decisions[0].model == "proportional"
    assert any(d.model == "measured" for d in pol.decisions[1:])
    best = min(range(1, 96), key=lambda a: max(compute([a, 96 - a])))
    assert abs(pol.shares[0] - best) <= 1, (pol.shares, best)


def test_a_move_being_tried_is_not_saved_as_kept():
    pol = BalancePolicy(64, 2, window=20, min_steps=5)
    drive(pol, per_sample([1e-3, 2e-3]), model_wall([1e-3, 2e-3]), 6)
    assert pol.trial is not None and pol.shares != [32, 32]
    assert pol.state_dict()["shares"] == [32, 32]
    pol.load_state_dict({"shares": [40, 24], "global_batch": 64, "world": 2})
    assert pol.trial is None and pol.shares == [40, 24]


def test_dynamic_balancer_switches_arms_only_at_exchanges():
    """sync_every=4: every buffered step ran with the shares in force at the last exchange; blocks last
    whole exchange intervals, and both ranks switch together."""
    p = [1e-3, 3e-3]

    def gather(values):  # both "ranks": rank 1's compute at its per-sample time, the same wall time
        rows = [values, list(values)]
        for j in range(0, len(values), 3):
            rows[1][j] = values[j] / bal.local_share / p[0] * bal.shares[1] * p[1]
            rows[0][j + 2] = rows[1][j + 2] = max(values[j], rows[1][j]) + 0.001
        return rows

    bal = DynamicBalancer(64, world=2, rank=0, sync_every=4, gather=gather, window=20, min_steps=4, verify_steps=4,
                          verify_block=2)
    trace = []
    for step in range(120):
        trace.append(bal.shares)
        bal.step(step, bal.local_share * p[0], 0.0, 0.0)
    changes = [i for i in range(1, len(trace)) if trace[i] != trace[i - 1]]
    assert changes and all(i % 4 == 0 for i in changes)
    assert [v.verdict for v in bal.verdicts] == ["kept"] and bal.shares == [48, 16]


@pytest.mark.parametrize("field,value", [("verify_steps", 1), ("verify_block", 0), ("backoff_steps", -1)])
def test_bad_verification_settings_are_refused_with_an_example(field, value):
    with pytest.raises(ConfigError, match=rf"parallelism.balance.{field}={value} must be >= .* use e.g."):
        BalancePolicy(64, 2, **{field: value})
