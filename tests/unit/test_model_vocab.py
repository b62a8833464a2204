"""A user's model whose vocabulary is smaller than the data's is refused before the first step (exit 2,
a message naming both sizes and the fixes), not by an IndexError in the embedding mid-run."""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from tests.conftest import ROOT
from trainperf.cli import main
from trainperf.models.build import model_vocab


class SmallVocab(nn.Module):
    """Hugging Face-like: the vocabulary is read from get_input_embeddings()."""

    def __init__(self, vocab: int = 100, block: int = 32):
        super().__init__()
        self.pos = nn.Embedding(block, 16)  # a larger embedding that is not the vocabulary
        self.tok = nn.Embedding(vocab, 16)
        self.head = nn.Linear(16, vocab)

    def get_input_embeddings(self):
        return self.tok

    def forward(self, idx, targets=None):
        logits = self.head(self.tok(idx))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def small_vocab(cfg):
    return SmallVocab()


def test_model_vocab_sources():
    assert model_vocab(SmallVocab(100)) == (100, "get_input_embeddings()")
    m = nn.Sequential(nn.Embedding(77, 4))
    assert model_vocab(m)[0] == 77
    m.vocab_size = 90
    assert model_vocab(m) == (90, "vocab_size")
    assert model_vocab(nn.Linear(2, 2)) == (None, "")


def test_smaller_vocabulary_refused_before_the_first_step(tiny_overrides, tmp_path, capsys):
    sets = sum((["--set", o] for o in tiny_overrides + [f"model.entrypoint={__name__}:small_vocab", "run.steps=2"]), [])
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *sets, "--resume", "never"]) == 2
    err = capsys.readouterr().err
    assert "the model's vocabulary (100 tokens, from get_input_embeddings()) is smaller than the data's (256" in err
    assert "resize_token_embeddings(256)" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran
