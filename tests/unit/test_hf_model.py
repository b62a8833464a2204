"""Hugging Face causal LMs as trainperf models (model.hf): loss convention, FQNs, checkpointing modes on
eager and SDPA attention, vocabulary check, contiguous targets. Tiny configs built in code; nothing
downloaded. One model per (layout, attention) for the module."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed")

from trainperf.config.schema import Config  # noqa: E402
from trainperf.errors import ConfigError  # noqa: E402

LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, "max_position_embeddings": 32}
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 96, "n_positions": 32,
        "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}


def _cfg(hf: dict, **model) -> Config:
    return Config.model_validate({"model": {"hf": hf, **model}, "run": {"device": "cpu"}})


_MODELS: dict = {}


def _model(kind: str, attn: str):
    """One built model per (kind, attention) for the whole module (HF construction is slow)."""
    from trainperf.memory.ac import remove_ac
    from trainperf.models.build import build_model

    key = (kind, attn)
    if key not in _MODELS:
        conf = LLAMA if kind == "llama" else GPT2
        _MODELS[key] = build_model(_cfg({"config": conf, "attn_implementation": attn}), data_vocab=90)
    m = _MODELS[key]
    remove_ac(m)
    m.zero_grad(set_to_none=True)
    return m


def _batch(seq: int = 16):
    x = torch.randint(0, 90, (2, seq + 1), generator=torch.Generator().manual_seed(0))
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_loss_uses_preshifted_targets_and_fqns_are_hf(kind):
    m = _model(kind, "sdpa")
    idx, tgt = _batch()
    logits, loss = m(idx, tgt)
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))
    assert torch.allclose(loss, ref)
    # HF's labels convention shifts once more: passing the pre-shifted targets as labels differs
    hf_loss = m(input_ids=idx, labels=tgt).loss
    assert not torch.allclose(hf_loss, loss)
    assert m.config.use_cache is False
    plain = transformers.AutoModelForCausalLM.from_config(m.config)
    assert list(m.state_dict()) == list(plain.state_dict())  # FQNs unchanged: from_pretrained can load them
    assert m._trainperf_block_path == ("model.layers" if kind == "llama" else "transformer.h")
    assert m.flops_per_token(16) > 6 * 32 * 32 * 2  # from the real shape


def _grads(m, idx, tgt):
    m.zero_grad(set_to_none=True)
    _, loss = m(idx, tgt)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("mode", ["full", "ratio", "every_k", "selective"])
def test_checkpointing_modes_on_hf_attention(attn, mode):
    from trainperf.memory.ac import apply_ac

    m = _model("llama", attn)
    idx, tgt = _batch()
    loss0, g0 = _grads(m, idx, tgt)
    plan = apply_ac(m, mode=mode, ratio=0.5, every_k=2)
    assert plan.block_path == "model.layers" and any(k != "none" for k in plan.kinds)
    loss1, g1 = _grads(m, idx, tgt)
    assert torch.allclose(loss0, loss1)
    assert g0.keys() == g1.keys()
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6)
    names = [n for n, _ in m.named_parameters()]
    assert names == list(dict(m.named_parameters()))  # unchanged by the class swap
    assert all(n.startswith(("model.", "lm_head.")) for n in names)


def test_selective_on_a_user_model_with_use_cache_default(tmp_path):
    """A user's HF model (model.entrypoint) keeps HF's use_cache=True default; build_model turns it off,
    which is what made selective checkpointing fail ("aten.slice.Tensor invocation index 4 ... not found")."""
    from trainperf.memory.ac import apply_ac
    from trainperf.models.build import _no_kv_cache

    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{k: v for k, v in LLAMA.items()
                                                                                  if k != "model_type"}))
    assert m.config.use_cache is True
    _no_kv_cache(m)
    apply_ac(m, mode="selective")
    idx, _ = _batch()
    m(input_ids=idx).logits.float().mean().backward()
    assert all(p.grad is not None for p in m.model.layers.parameters())


def test_vocabulary_checked_against_the_data():
    from trainperf.models.build import build_model

    with pytest.raises(ConfigError, match=r"data's vocabulary \(200 tokens\) is larger than the model's vocab_size=96"):
        build_model(_cfg({"config": LLAMA}), data_vocab=200)


def test_config_errors_name_the_fix(tmp_path):
    from trainperf.models.shape import model_shape
    from trainperf.models.build import build_model

    with pytest.raises(ConfigError, match="exactly one of"):
        model_shape(_cfg({}))
    with pytest.raises(ConfigError, match="no config.json"):
        model_shape(_cfg({"path": str(tmp_path)}))
    with pytest.raises(ConfigError, match="model_type"):
        model_shape(_cfg({"config": {"hidden_size": 8}}))
    with pytest.raises(ConfigError, match="model.blocks='model.layer'.*did you mean 'model.layers'"):
        build_model(_cfg({"config": LLAMA}, blocks="model.layer"))
    # sequence length: model.block_size, else min(context, 1024)
    assert model_shape(_cfg({"config": LLAMA}))["block_size"] == 32
    assert model_shape(_cfg({"config": LLAMA}, block_size=16))["block_size"] == 16
    with pytest.raises(ConfigError, match="learned position embeddings"):
        model_shape(_cfg({"config": GPT2}, block_size=64))
    # tensor parallelism is checked before any work
    from trainperf.train.resolve import check_model_shape

    c = _cfg({"config": LLAMA})
    c.parallelism.tensor = 4
    with pytest.raises(ConfigError, match="num_key_value_heads=2"):
        check_model_shape(c)
    c = _cfg({"config": GPT2})
    c.parallelism.tensor, c.parallelism.data_shard = 2, 2
    with pytest.raises(ConfigError, match="not supported for GPT-2"):
        check_model_shape(c)


def test_local_directory_round_trip_after_checkpointing(tmp_path):
    """A trained model (AC on) saves with save_pretrained and model.hf.path loads the same weights."""
    from trainperf.memory.ac import apply_ac
    from trainperf.models.build import build_model

    m = _model("llama", "sdpa")
    apply_ac(m, mode="full")
    m.save_pretrained(tmp_path / "ckpt")
    m2 = build_model(_cfg({"path": str(tmp_path / "ckpt")}), data_vocab=90)
    for (n1, p1), (n2, p2) in zip(m.state_dict().items(), m2.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    idx, tgt = _batch()
    assert torch.allclose(m(idx, tgt)[1], m2(idx, tgt)[1])


def test_dropout_noted():
    from trainperf.models.build import build_model

    m = build_model(_cfg({"config": {**GPT2, "resid_pdrop": 0.1}}))
    assert "dropout 0" in m.trainperf_notes["model.hf dropout"]


def test_targets_are_contiguous():
    import numpy as np

    from trainperf.data.hybrid import split_lm
    from trainperf.data.loader import windows_to_batch

    w = np.arange(2 * 9, dtype=np.uint16).reshape(2, 9)
    for x, y in (windows_to_batch(w, torch.device("cpu")), split_lm(torch.from_numpy(w.astype(np.int64)))):
        assert x.is_contiguous() and y.is_contiguous()
        assert torch.equal(y.view(-1), torch.from_numpy(w[:, 1:].astype(np.int64)).reshape(-1))


def test_trainperf_train_with_model_hf(tmp_path):
    """End to end through the CLI: resolve (shape and sequence length from the HF config), build, train
    with selective checkpointing, MFU from the model's real shape."""
    import json

    from trainperf.cli import main

    cfg = tmp_path / "hf.yaml"
    cfg.write_text(
        "model: {hf: {config: {model_type: llama, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,\n"
        "  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 320, max_position_embeddings: 16}}}\n"
        "data: {source: synthetic}\ntrain: {global_batch: 2, micro_batch: 2}\n"
        "run: {steps: 3, log_every: 1, eval_every: 0, eval_batches: 1, sample_tokens: 0, progress: false, threads: 1,"
        " device: cpu}\nmemory: {checkpointing: {mode: selective}}\ncheckpoint: {at_end: false}\n")
    assert main(["train", str(cfg), "--set", f"run.dir={tmp_path / 'run'}", "--resume", "never"]) == 0
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["steps"] == 3 and s["tokens"] == 3 * 2 * 16  # sequence length 16 from max_position_embeddings
    assert s["mfu"] is not None and s["flops_per_token_formula"] > 0


def test_memory_estimate_of_an_hf_model_matches_the_measurement():
    """`trainperf memory --measure` on a Hugging Face Llama: the traced estimate of every checkpointing mode
    lands within 10% of the measured activation bytes (measured: within 0.1%)."""
    from trainperf.train.resolve import resolve
    from trainperf.memory.report import memory_report

    cfg = _cfg({"config": dict(LLAMA, max_position_embeddings=64)}, block_size=32)
    cfg.train.global_batch = cfg.train.micro_batch = 4
    cfg.run.device = "cpu"
    rep = memory_report(resolve(cfg).cfg, measure=True, reps=1, progress=False)
    assert rep["model"].startswith("Hugging Face LlamaForCausalLM") and rep["block_path"] == "model.layers"
    for row in rep["modes"]:
        est, got = row["estimate_bytes"]["activations"], row["measured_bytes"]["activations"]
        assert abs(est - got) <= 0.10 * got, (row["label"], est, got)


@pytest.mark.parametrize("field,value,needle", [
    ("num_attention_heads", 0, "num_attention_heads=0 must be a whole number in \\[1,"),  # was ZeroDivisionError
    ("num_attention_heads", -1, "transformers refused it|num_attention_heads=-1 must be"),  # was a tensor error
    ("num_key_value_heads", 0, "num_key_value_heads=0 must be a whole number"),
    ("hidden_size", 10**12, "transformers refused it|hidden_size=1000000000000 must be"),  # was an allocator error
    ("intermediate_size", -1, "intermediate_size=-1 must be a whole number"),  # was "negative dimension"
    ("vocab_size", "abc", "vocab_size='abc' must be a whole number"),  # was StrictDataclassFieldValidationError
    ("rms_norm_eps", "abc", "transformers refused it"),           # a field trainperf does not check itself
    ("model_type", [1], "model.hf.config.model_type=\\[1\\]: needs a model type name"),  # TypeError: unhashable
])
def test_a_config_transformers_or_the_model_cannot_build_is_a_config_error(field, value, needle):
    from trainperf.models.shape import model_shape

    with pytest.raises(ConfigError, match=needle):
        model_shape(_cfg({"config": {**LLAMA, field: value}}))
