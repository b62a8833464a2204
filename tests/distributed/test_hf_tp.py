"""Tensor parallelism for a tiny Hugging Face Llama (GQA, SwiGLU, SDPA): two gloo processes with TP=2,
with and without sequence parallelism, give the loss and gradients of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed")

pytestmark = pytest.mark.distributed

LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64, max_position_embeddings=16, tie_word_embeddings=False)


def _model(**over):
    from trainperf.config.schema import Config
    from trainperf.models.build import build_model

    cfg = Config.model_validate({"model": {"hf": {"config": {"model_type": "llama", **LLAMA, **over}}},
                                 "run": {"seed": 5}})
    return build_model(cfg)


def _worker(rank: int, world: int, out: str, tied: bool):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from trainperf.distributed.hf_tp import apply_hf_tp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(out, 'store')}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        x = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
        idx, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
        ref = _model(tie_word_embeddings=tied)
        _, ref_loss = ref(idx, tgt)
        ref_loss.backward()
        res = {}
        for sp in (False, True):
            m = _model(tie_word_embeddings=tied)
            apply_hf_tp(m, mesh, sequence_parallel=sp)
            _, loss = m(idx, tgt)
            loss.backward()
            worst = 0.0
            for (n, p), (n0, p0) in zip(m.named_parameters(), ref.named_parameters()):
                assert n == n0, (n, n0)
                g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                worst = max(worst, ((g - p0.grad).abs().max() / p0.grad.abs().max().clamp_min(1e-12)).item())
            n_dt = sum(isinstance(p, DTensor) for p in m.parameters())
            res[str(sp)] = {"loss": loss.item(), "ref": ref_loss.item(), "grad_rel": worst, "dtensors": n_dt}
        if rank == 0:
            Path(out, "res.json").write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tied", [False, True])
def test_llama_tp2_matches_one_process(tmp_path, tied):
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, str(tmp_path), tied), nprocs=2, join=True)
    res = json.loads((tmp_path / "res.json").read_text())
    for sp, r in res.items():
        assert r["loss"] == pytest.approx(r["ref"], rel=1e-5), (sp, r)
        assert r["grad_rel"] < 1e-5, (sp, r)
        assert r["dtensors"] >= 7 * 2  # q/k/v/o/gate/up/down of both layers are sharded


def test_tp_refusals():
    from trainperf.distributed.hf_tp import _layers, check_tp_degree
    from trainperf.errors import ConfigError

    with pytest.raises(ConfigError, match="num_key_value_heads=2.*among 1, 2"):
        check_tp_degree(4, 2, 4)
    with pytest.raises(ConfigError, match="num_attention_heads=6.*among 1, 2, 3, 6"):
        check_tp_degree(6, 6, 4)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32,
                                                                n_positions=8))
    with pytest.raises(ConfigError, match="fused c_attn"):
        _layers(gpt2)
