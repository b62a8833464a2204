"""Activation checkpointing: block discovery, plans, names, errors, and training equivalence."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from trainperf.errors import ConfigError
from trainperf.memory.ac import apply_ac, find_blocks, plan_kinds, remove_ac, spread
from trainperf.models.gpt import GPT, GPTConfig

SMALL = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=128)
TRAIN = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
MODES = [("none", {}), ("full", {}), ("ratio", {"ratio": 0.5}), ("every_k", {"every_k": 2}), ("selective", {})]


class Blk(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.n, self.a, self.b = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(3 * d, d)

    def forward(self, x):
        return x + self.b(torch.tanh(self.a(self.n(x))))


class UserModel(nn.Module):
    """A user's model: blocks at "body.stack", plus a distractor list of 2."""

    def __init__(self, vocab=100, d=32, n=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.body = nn.Module()
        self.body.stack = nn.ModuleList([Blk(d) for _ in range(n)])
        self.heads = nn.ModuleList([nn.Linear(d, vocab), nn.Linear(d, vocab)])

    def forward(self, idx, targets):
        h = self.emb(idx)
        for blk in self.body.stack:
            h = blk(h)
        logits = self.heads[0](h) + self.heads[1](h)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Flat(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.ReLU()

    def forward(self, x, y):
        return self.b(self.a(x)), self.a(x).sum()


def test_spread_and_plans():
    assert spread(4, 1) == [0]
    assert spread(8, 2) == [0, 4]
    assert spread(12, 3) == [0, 4, 8]
    assert plan_kinds("ratio", 4, ratio=0.25) == ["full", "none", "none", "none"]  # one block in four
    assert plan_kinds("ratio", 8, ratio=0.5).count("full") == 4
    assert plan_kinds("every_k", 8, every_k=3) == ["full", "none", "none", "full", "none", "none", "full", "none"]
    assert plan_kinds("budget", 4, n_full=1, n_selective=3) == ["full", "selective", "selective", "selective"]


@pytest.mark.parametrize("ratio", [0.0, -0.1, 1.5])
def test_ratio_outside_range(ratio):
    with pytest.raises(ConfigError, match=r"outside \(0, 1\]"):
        apply_ac(GPT(GPTConfig(**SMALL)), mode="ratio", ratio=ratio)


def test_find_blocks_auto_and_named():
    m = UserModel()
    path, blocks = find_blocks(m)
    assert path == "body.stack" and len(blocks) == 6  # the largest list of identical blocks wins
    assert find_blocks(m, "body.stack")[0] == "body.stack"
    assert find_blocks(GPT(GPTConfig(**SMALL)))[0] == "layers"


def test_bad_block_path_lists_candidates():
    with pytest.raises(ConfigError) as err:
        apply_ac(UserModel(), mode="full", blocks="transformer.h")
    msg = str(err.value)
    assert "transformer.h" in msg and "does not exist" in msg and "'body.stack'" in msg and "'heads'" in msg
    with pytest.raises(ConfigError, match="not a list of blocks"):
        apply_ac(UserModel(), mode="full", blocks="emb")


def test_no_repeated_blocks():
    with pytest.raises(ConfigError, match="no ModuleList"):
        apply_ac(Flat(), mode="ratio", ratio=0.5)
    assert apply_ac(Flat(), mode="none").n_blocks == 0


@pytest.mark.parametrize("mode,kw", MODES)
def test_names_and_state_dict_unchanged(mode, kw):
    torch.manual_seed(0)
    ref = GPT(GPTConfig(**SMALL))
    m = GPT(GPTConfig(**SMALL))
    plan = apply_ac(m, mode=mode, **kw)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    assert list(m.state_dict()) == list(ref.state_dict())
    ref.load_state_dict(m.state_dict())  # a checkpoint of an AC model loads into a plain one ...
    m.load_state_dict(ref.state_dict())  # ... and back
    if mode != "none":
        assert plan.full or plan.selective
        assert all(isinstance(b, type(ref.layers["0"])) for b in m.layers.values())
    remove_ac(m)
    assert all(type(b) is type(ref.layers["0"]) for b in m.layers.values())


def _train(mode: str, kw: dict, steps: int = 20) -> list[float]:
    torch.manual_seed(1234)
    model = GPT(GPTConfig(**TRAIN))
    apply_ac(model, mode=mode, **kw)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, 64, (2, 17), generator=g)
    x, y = data[:, :-1], data[:, 1:]  # one fixed batch: memorizing it makes the loss fall
    losses = []
    for _ in range(steps):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.fixture
def one_thread():
    """Tiny tensors: one intra-op thread avoids spin-waiting when other jobs share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_training_matches_without_ac(one_thread):
    """Same seed, fp32, no dropout, 20 AdamW steps: every mode follows the same loss curve.
    Tolerance: 1e-5 absolute per step (recompute is the same arithmetic; differences would be
    float reassociation only)."""
    base = _train("none", {})
    assert base[-1] < base[0] - 0.1  # it learns something
    for mode, kw in MODES[1:]:
        losses = _train(mode, kw)
        assert max(abs(a - b) for a, b in zip(losses, base)) < 1e-5, mode


def test_dropout_recompute_uses_same_mask():
    """With dropout, full AC restores the RNG state for the recompute: gradients equal the plain model's."""
    cfg = GPTConfig(**{**SMALL, "dropout": 0.2})
    grads = []
    for mode in ("none", "full"):
        torch.manual_seed(0)
        m = GPT(cfg)
        apply_ac(m, mode=mode)
        x = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(3))
        torch.manual_seed(5)
        m(x, x)[1].backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_user_model_ratio_trains_same():
    def run(mode):
        torch.manual_seed(0)
        m = UserModel()
        apply_ac(m, mode=mode, ratio=0.5, blocks="body.stack")
        x = torch.randint(0, 100, (3, 16), generator=torch.Generator().manual_seed(1))
        m(x, x)[1].backward()
        return torch.cat([p.grad.flatten() for p in m.parameters()])
    assert torch.allclose(run("none"), run("ratio"), atol=1e-6)
