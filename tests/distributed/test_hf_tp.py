"""Tensor parallelism for a tiny Hugging Face Llama (GQA, SwiGLU, SDPA) and GPT-2 (fused c_attn): two gloo
processes with TP=2 (Llama also with sequence parallelism) give the loss and gradients of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed")

pytestmark = pytest.mark.distributed

LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64, max_position_embeddings=16, tie_word_embeddings=False)


GPT2 = dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=16, attn_pdrop=0.0,
            resid_pdrop=0.0, embd_pdrop=0.0)


def _model(gpt2: bool = False, **over):
    from trainperf.config.schema import Config
    from trainperf.models.build import build_model

    conf = GPT2 if gpt2 else {"model_type": "llama", **LLAMA, **over}
    cfg = Config.model_validate({"model": {"hf": {"config": conf}}, "run": {"seed": 5}})
    return build_model(cfg)


CASES = (False, True, "gpt2")  # Llama untied, Llama tied embeddings, GPT-2 (tied, fused c_attn)


def _worker(rank: int, world: int, out: str):
    import torch.distributed as dist

    from trainperf.distributed.init import destroy_distributed

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'store')}", rank=rank, world_size=world)
    ok = False
    try:
        _cases(rank, world, out)  # its models and DTensors are gone when it returns, before the group
        ok = True
    finally:
        destroy_distributed(barrier=ok)


def _cases(rank: int, world: int, out: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from trainperf.distributed.hf_tp import apply_hf_tp

    mesh = init_device_mesh("cpu", (world,))
    x = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    idx, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    res = {}
    for case in CASES:  # one spawn for every case: the processes' imports dominate the time
        kw = {"gpt2": case == "gpt2", "tie_word_embeddings": case is True}
        ref = _model(**kw)
        _, ref_loss = ref(idx, tgt)
        ref_loss.backward()
        for sp in ((False,) if case == "gpt2" else (False, True)):
            m = _model(**kw)
            apply_hf_tp(m, mesh, sequence_parallel=sp)
            _, loss = m(idx, tgt)
            loss.backward()
            worst = 0.0
            for (n, p), (n0, p0) in zip(m.named_parameters(), ref.named_parameters()):
                assert n == n0, (n, n0)
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                worst = max(worst, ((g - p0.grad).abs().max() / p0.grad.abs().max().clamp_min(1e-12)).item())
            n_dt = sum(isinstance(p, DTensor) for p in m.parameters())
            res[f"{case}/sp={sp}"] = {"loss": loss.item(), "ref": ref_loss.item(), "grad_rel": worst,
                                      "dtensors": n_dt, "gpt2": case == "gpt2"}
    if rank == 0:
        Path(out, "res.json").write_text(json.dumps(res))


def test_tp2_matches_one_process(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(tmp_path)), nprocs=2, join=True)
    res = json.loads((tmp_path / "res.json").read_text())
    assert len(res) == 5
    for case, r in res.items():
        assert r["loss"] == pytest.approx(r["ref"], rel=1e-5), (case, r)
        assert r["grad_rel"] < 1e-5, (case, r)
        assert r["dtensors"] >= (8 if r["gpt2"] else 7) * 2  # the projections of both layers are sharded


def test_tp_refusals():
    from trainperf.distributed.hf_tp import _layers, check_tp_degree
    from trainperf.errors import ConfigError

    with pytest.raises(ConfigError, match="num_key_value_heads=2.*among 1, 2"):
        check_tp_degree(4, 2, 4)
    with pytest.raises(ConfigError, match="num_attention_heads=6.*among 1, 2, 3, 6"):
        check_tp_degree(6, 6, 4)
    with pytest.raises(ConfigError, match="Llama-style decoder"):
        _layers(torch.nn.Linear(2, 2))


def _fsdp_tp_worker(rank: int, world: int, out: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainperf.distributed.hf_tp import apply_hf_tp
    from trainperf.models.blocks import find_blocks

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'store')}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        x = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(0))
        idx, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        ref = _model()
        _, ref_loss = ref(idx, tgt)
        ref_loss.backward()
        m = _model()
        apply_hf_tp(m, mesh["tp"], sequence_parallel=True)
        path, blocks = find_blocks(m)  # the block path recorded by model.hf: the decoder layers
        for b in blocks:
            fully_shard(b, mesh=mesh["dp"])
        fully_shard(m, mesh=mesh["dp"])
        r = mesh["dp"].get_local_rank()
        _, loss = m(idx[2 * r:2 * r + 2], tgt[2 * r:2 * r + 2])  # each data rank: half the batch
        loss.backward()
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=mesh["dp"].get_group())
        worst = max(((p.grad.full_tensor() - p0.grad).abs().max() / p0.grad.abs().max()).item()
                    for p, p0 in zip(m.parameters(), ref.parameters()))
        if rank == 0:
            Path(out, "res.json").write_text(json.dumps({"loss": mean.item() / 2, "ref": ref_loss.item(),
                                                         "grad_rel": worst, "path": path}))
    finally:
        dist.destroy_process_group()


def test_llama_fsdp2_x_tp2_with_sp_matches_one_process(tmp_path):
    """FSDP2 (per decoder layer, through the block finder) x TP=2 with sequence parallelism, 4 gloo processes."""
    import torch.multiprocessing as mp

    mp.spawn(_fsdp_tp_worker, args=(4, str(tmp_path)), nprocs=4, join=True)
    res = json.loads((tmp_path / "res.json").read_text())
    assert res["path"] == "model.layers"
    assert res["loss"] == pytest.approx(res["ref"], rel=1e-5)
    assert res["grad_rel"] < 1e-5, res
