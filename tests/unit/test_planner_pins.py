"""`trainperf plan` pins mean what they say (issue 22): every fixed flag holds in every candidate, the
JSON echoes it, `--recompute full` is every layer of every stage, stack presets and the flags beside
them, and the 80% interval on best and every candidate (narrower after --measured)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trainperf.cli import main
from trainperf.planner.stack import PRESETS

# 24 layers, 16 heads: every pin below is feasible on 16 H100s with a 64-sequence batch
SHAPE = ["--hidden", "2048", "--layers", "24", "--heads", "16", "--seq", "2048", "--vocab", "50304",
         "--gpus", "16", "--gpu", "h100-sxm", "--global-batch", "64", "--top", "1000"]


def _json(capsys, *argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_recompute_full_recomputes_every_layer_of_every_stage(capsys):
    # the issue's case: a 24-layer model on one stage once came back with 12 layers recomputed
    out = _json(capsys, *SHAPE, "--pp", "1", "--recompute", "full")
    assert out["candidates"] and out["pins"]["recompute"] == "full"
    for c in out["candidates"]:
        assert c["recompute"] == "full" and c["recompute_layers_per_stage"] == 24, c
    out = _json(capsys, *SHAPE, "--recompute", "full")
    assert any(c["pp"] > 1 for c in out["candidates"])
    for c in out["candidates"]:
        assert c["recompute"] == "full" and c["recompute_layers_per_stage"] == 24 // c["pp"], c


def test_partial_recompute_is_its_own_value(capsys):
    out = _json(capsys, *SHAPE, "--recompute", "partial", "--recompute-layers", "5", "--pp", "2")
    assert out["pins"]["recompute"] == "partial" and out["pins"]["recompute-layers"] == 5
    assert all(c["recompute"] == "partial" and c["recompute_layers_per_stage"] == 5 for c in out["candidates"])
    # --recompute-layers alone implies partial
    out = _json(capsys, *SHAPE, "--recompute-layers", "3")
    assert all(c["recompute"] == "partial" and c["recompute_layers_per_stage"] == 3 for c in out["candidates"])
    # unpinned, the search may choose partial; pinned to another mode it never does
    free = _json(capsys, *SHAPE, "--tp", "1", "--pp", "1")
    assert {c["recompute"] for c in free["candidates"]} >= {"none", "full", "partial"}
    for mode in ("none", "selective"):
        assert {c["recompute"] for c in _json(capsys, *SHAPE, "--recompute", mode)["candidates"]} == {mode}


@pytest.mark.parametrize("argv,needle", [
    (["--recompute", "full", "--recompute-layers", "4"], "goes with --recompute partial"),
    (["--recompute", "partial", "--recompute-layers", "24", "--pp", "1"], "use --recompute full"),
    (["--stack", "megatron2021"], "megatron-2021"),
])
def test_contradictory_pins_exit_2(capsys, argv, needle):
    assert main(["plan", *SHAPE, *argv]) == 2
    assert needle in capsys.readouterr().err


# flag -> (value given, candidate key, value expected in every candidate); extra flags a pin needs
PINS = {
    "tp": (["--tp", "2"], "tp", 2),
    "pp": (["--pp", "2"], "pp", 2),
    "dp": (["--dp", "4"], "dp", 4),
    "microbatch": (["--microbatch", "2"], "micro_batch", 2),
    "interleave": (["--interleave", "2", "--pp", "2"], "interleave", 2),
    "recompute": (["--recompute", "selective"], "recompute", "selective"),
    "sequence-parallel": (["--sequence-parallel"], "sequence_parallel", True),
    "zero": (["--zero", "1"], "zero", 1),
    "cp": (["--cp", "2"], "cp", 2),
    "hsdp-shard": (["--hsdp-shard", "2", "--zero", "3"], "hsdp_shard", 2),
}


@pytest.mark.parametrize("flag", sorted(PINS))
def test_every_pin_holds_in_every_candidate_and_is_echoed(capsys, flag):
    from trainperf.cli.plan import PIN_FLAGS

    assert set(PINS) <= set(PIN_FLAGS) | {"recompute-layers"}
    argv, key, want = PINS[flag]
    out = _json(capsys, *SHAPE, *argv)
    assert out["pins"][flag] == want
    assert out["best"][key] == want
    assert out["candidates"] and all(c[key] == want for c in out["candidates"]), flag


def test_the_pin_audit_covers_every_layout_flag():
    from trainperf.cli.plan import PIN_FLAGS

    assert set(PIN_FLAGS) == set(PINS) | {"recompute-layers"}


def test_pins_hold_after_measured(capsys):
    out = _json(capsys, *SHAPE, "--tp", "2", "--pp", "1", "--microbatch", "2", "--recompute", "full", "--zero", "1",
                "--no-sequence-parallel", "--measured", "3.0")
    assert out["pins"]["recompute"] == "full" and out["pins"]["tp"] == 2
    for c in out["candidates"]:
        assert (c["tp"], c["pp"], c["micro_batch"], c["recompute"], c["zero"], c["sequence_parallel"]) == \
            (2, 1, 2, "full", 1, False)


def test_stack_presets_have_the_issue_names_and_set_mechanisms(capsys):
    assert {"megatron-2021", "megatron-core", "fsdp", "torchtitan"} <= set(PRESETS)
    m21 = _json(capsys, *SHAPE, "--stack", "megatron-2021")
    assert m21["pins"]["stack"] == "megatron-2021"
    assert m21["stack"]["mechanisms"]["dp_reduce"] == "after"
    assert m21["stack"]["mechanisms"]["attention"] == "eager" and m21["model"]["attention"] == "eager"
    assert m21["stack"]["source"]["dp_reduce"] == "preset megatron-2021"
    assert all(c["zero"] == 0 for c in m21["candidates"])
    assert all(c["zero"] == 3 for c in _json(capsys, *SHAPE, "--stack", "fsdp")["candidates"])
    assert all(c["zero"] == 1 for c in _json(capsys, *SHAPE, "--stack", "megatron-core")["candidates"])
    # a flag given beside a preset overrides it, and the pinned ZeRO stage beats the preset's
    over = _json(capsys, *SHAPE, "--stack", "megatron-2021", "--dp-reduce", "overlap", "--zero", "1")
    assert over["stack"]["mechanisms"]["dp_reduce"] == "overlap" and over["stack"]["source"]["dp_reduce"] == "flag"
    assert over["pins"]["dp-reduce"] == "overlap" and over["pins"]["zero"] == 1
    assert all(c["zero"] == 1 for c in over["candidates"])


def test_a_preset_searches_only_what_its_stack_had(capsys):
    # Megatron-LM 2021 had neither sequence parallelism nor selective / block recompute (Korthikanti et al.
    # 2022 brought both): its preset never chooses them; a pin beside it still wins and says so
    m21 = _json(capsys, *SHAPE, "--stack", "megatron-2021")
    assert any(c["tp"] > 1 for c in m21["candidates"])
    assert not any(c["sequence_parallel"] for c in m21["candidates"])
    assert {c["recompute"] for c in m21["candidates"]} <= {"none", "full"}
    assert {c["recompute"] for c in m21["candidates"]} == {"none", "full"}  # both searched
    assert m21["stack"]["mechanisms"]["sequence_parallel"] is False
    assert m21["stack"]["source"]["sequence_parallel"] == "preset megatron-2021"
    free = _json(capsys, *SHAPE, "--dp-reduce", "after", "--attention", "eager", "--zero", "0")
    assert any(c["sequence_parallel"] for c in free["candidates"])  # the default stack searches it
    over = _json(capsys, *SHAPE, "--stack", "megatron-2021", "--sequence-parallel", "--recompute", "selective")
    assert over["candidates"] and all(c["sequence_parallel"] and c["recompute"] == "selective"
                                      for c in over["candidates"])
    assert over["stack"]["source"]["sequence_parallel"] == "flag" and over["stack"]["source"]["recompute"] == "flag"
    # torchtitan's TP plan always shards the norms: every TP layout is sequence-parallel, TP 1 still searched
    tt = _json(capsys, *SHAPE, "--stack", "torchtitan")["candidates"]
    assert all(c["sequence_parallel"] == (c["tp"] > 1) for c in tt) and {c["tp"] > 1 for c in tt} == {True, False}


def test_stacks_lists_every_preset_and_what_it_sets(capsys):
    assert main(["plan", "--stacks"]) == 0
    text = capsys.readouterr().out
    for name in PRESETS:
        assert f"\n{name}\n" in f"\n{text}"
    assert "sequence_parallel=False, recompute=none|full" in text
    listed = _json(capsys, "--stacks")
    assert set(listed) == set(PRESETS)
    assert listed["megatron-2021"]["mechanisms"]["dp_reduce"] == "after"
    assert listed["torchtitan"]["mechanisms"]["fsdp_reduce_bytes"] == 4.0


def test_the_reduction_after_the_backward_costs_time(capsys):
    pin = ["--tp", "1", "--pp", "1", "--microbatch", "2", "--recompute", "none", "--zero", "0"]
    after = _json(capsys, *SHAPE, *pin, "--dp-reduce", "after")["best"]["step_time_s"]
    overlap = _json(capsys, *SHAPE, *pin, "--dp-reduce", "overlap")["best"]["step_time_s"]
    assert after > overlap
    unfused = _json(capsys, *SHAPE, *pin, "--no-fused")["best"]["step_time_s"]
    fused = _json(capsys, *SHAPE, *pin, "--fused")["best"]["step_time_s"]
    assert unfused >= fused


@pytest.mark.parametrize("norm,gated,bias,dropout", [(n, g, b, d) for n in ("layernorm", "rmsnorm")
                                                     for g in (False, True) for b in (False, True)
                                                     for d in (False, True)])
def test_fused_elementwise_never_moves_more_bytes_or_launches_more_kernels(norm, gated, bias, dropout):
    from trainperf.analytic.spec import TransformerSpec
    from trainperf.planner.kernels import elementwise_bytes, softmax_bytes

    m = TransformerSpec(hidden=1024, layers=2, heads=8, seq=512, vocab=1000, norm=norm, gated=gated, bias=bias)
    fs, fa, fk = elementwise_bytes(m, True, dropout)
    us, ua, uk = elementwise_bytes(m, False, dropout)
    assert fs <= us and fa <= ua and fk <= uk
    if norm == "rmsnorm" or bias or dropout or gated:  # eager PyTorch runs these as several kernels
        assert fs + fa < us + ua
    assert all(f < u for f, u in zip(softmax_bytes(True, dropout), softmax_bytes(False, dropout)))


def _key(c):
    return tuple(c[k] for k in ("tp", "pp", "dp", "cp", "micro_batch", "interleave", "recompute", "zero",
                                "sequence_parallel"))


def _width(c):
    lo, hi = c["step_time_interval_s"]
    return (hi - lo) / c["step_time_s"]


def test_interval_on_best_and_every_candidate_and_narrower_after_measured(capsys):
    out = _json(capsys, *SHAPE, "--top", "20")
    for c in [out["best"], *out["candidates"]]:
        lo, hi = c["step_time_interval_s"]
        assert lo < c["step_time_s"] < hi
    assert out["interval"]["level"] == 0.8
    cal = _json(capsys, *SHAPE, "--top", "20", "--tp", "1", "--pp", "1", "--microbatch", "2", "--recompute", "none",
                "--zero", "3", "--measured", "1.0")
    # the same layout's interval is narrower once calibrated (the width grows with the step's non-compute share,
    # so layouts are compared with themselves)
    before = {_key(c): _width(c) for c in out["candidates"]}
    same = [(_width(c), before[_key(c)]) for c in cal["candidates"] if _key(c) in before]
    assert same and all(after < b for after, b in same)
    assert cal["interval"]["basis"] != out["interval"]["basis"]
    assert main(["plan", *SHAPE, "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "80% interval s" in text


def test_attention_kernel_is_a_mechanism_that_matters_only_where_the_hardware_says(capsys):
    # FlashAttention-2's mma.sync gets 2/3 of Hopper's peak (FlashAttention-3 paper), the whole of Ampere's:
    # --attention-kernel fa2 slows an H100 plan and leaves an A100 plan alone; presets set it, a flag wins
    from trainperf.planner.kernels import Kernels
    from trainperf.planner.constants import DEFAULTS
    from trainperf.hardware.catalog import get_gpu

    h100, a100 = Kernels(get_gpu("h100-sxm"), DEFAULTS), Kernels(get_gpu("a100-80gb"), DEFAULTS)
    args = (4, 16, 8192, 8192, 128, 0.5)
    for k, slower in ((h100, True), (a100, False)):
        (f2, b2), (f3, b3) = k.flash(*args, kernel="fa2"), k.flash(*args, kernel="fa3")
        assert (f2 > f3 and b2 > b3) if slower else (f2 == f3 and b2 == b3)
    # the matmul part is exactly 1.5x (what is left is the softmax and launch cost, the same in both)
    no_sm = replace(DEFAULTS, softmax_ops_per_score=0.0, kernel_overhead_s=0.0)
    kh = Kernels(get_gpu("h100-sxm"), no_sm)
    assert kh.flash(*args, kernel="fa2")[0] == pytest.approx(1.5 * kh.flash(*args, kernel="fa3")[0])

    seq = SHAPE.index("--seq") + 1
    long = SHAPE[:seq] + ["16384"] + SHAPE[seq + 1:] + ["--tp", "1", "--pp", "1", "--microbatch", "1",
                                                            "--recompute", "full", "--zero", "3"]
    fa2 = _json(capsys, *long, "--stack", "torchtitan")
    assert fa2["stack"]["mechanisms"]["attention_kernel"] == "fa2"
    assert fa2["stack"]["source"]["attention_kernel"] == "preset torchtitan"
    fa3 = _json(capsys, *long, "--stack", "torchtitan", "--attention-kernel", "fa3")
    assert fa3["pins"]["attention-kernel"] == "fa3" and fa3["stack"]["source"]["attention_kernel"] == "flag"
    assert fa2["best"]["step_time_s"] > fa3["best"]["step_time_s"]
    assert _json(capsys, *long, "--stack", "megatron-core")["stack"]["mechanisms"]["attention_kernel"] == "fa3"
    a100_args = [a if a != "h100-sxm" else "a100-80gb" for a in long]
    assert (_json(capsys, *a100_args, "--attention-kernel", "fa2")["best"]["step_time_s"]
            == _json(capsys, *a100_args, "--attention-kernel", "fa3")["best"]["step_time_s"])
    with pytest.raises(SystemExit) as e:
        main(["plan", *SHAPE, "--attention-kernel", "fa4"])
    assert e.value.code == 2 and "fa4" in capsys.readouterr().err
    # a kernel generation for an attention that runs none is a contradiction, not a silent no-op
    for extra in (["--attention", "eager"], ["--stack", "megatron-2021"]):
        assert main(["plan", *SHAPE, *extra, "--attention-kernel", "fa2"]) == 2
        assert "runs no FlashAttention kernel" in capsys.readouterr().err
    assert main(["plan", *SHAPE, "--stack", "megatron-2021", "--attention", "flash", "--attention-kernel", "fa2"]) == 0
    capsys.readouterr()


def test_grad_reduce_op_flag_is_echoed_and_costs_a_zero1_layout_more(capsys):
    zero1 = [*SHAPE, "--tp", "1", "--pp", "1", "--zero", "1", "--dp-reduce", "after"]
    rs = _json(capsys, *zero1)
    ar = _json(capsys, *zero1, "--grad-reduce-op", "all-reduce")
    assert ar["pins"]["grad-reduce-op"] == "all-reduce" and ar["stack"]["source"]["grad_reduce_op"] == "flag"
    assert rs["stack"]["mechanisms"]["grad_reduce_op"] == "reduce-scatter"
    assert ar["best"]["step_time_s"] > rs["best"]["step_time_s"]
    with pytest.raises(SystemExit) as e:
        main(["plan", *SHAPE, "--grad-reduce-op", "allreduce"])
    assert e.value.code == 2 and "allreduce" in capsys.readouterr().err
