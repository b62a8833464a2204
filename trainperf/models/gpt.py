"""A decoder-only transformer (GPT-2 style) as a plain ``nn.Module``.

The model knows nothing of parallelism, checkpointing or compilation: those are
applied from outside by the ``apply_*`` functions. Layers live in a
``ModuleDict`` keyed by their index, so a pipeline stage can delete the layers
it does not own and keep the fully qualified names of the rest (checkpoints
stay compatible across layouts). Attention projections are separate (q, k, v,
o) so tensor-parallel plans shard them column-/row-wise without reshuffling.

Loss convention (also for a user's model): ``forward(idx, targets)`` returns
``(logits, loss)`` where ``loss`` is the mean cross-entropy over all target
tokens of the micro-batch; with ``targets=None`` it returns ``(logits, None)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block_size: int = 128
    vocab_size: int = 256
    dropout: float = 0.0
    bias: bool = True
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # (B, T, C)
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them.
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )  # (B, nh, T, hd)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, C_local)
        return self.resid_drop(self.o_proj(y))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))  # (B, T, 4C) -> (B, T, C)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))  # (B, T, C)
        x = x + self.mlp(self.ln_2(x))  # (B, T, C)
        return x


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.norm = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialize every parameter (GPT-2 scheme); call after ``to_empty`` on a meta-built model."""
        std = self.cfg.init_std
        # Residual output projections scaled by 1/sqrt(2 * n_layer) (GPT-2).
        resid_std = std / math.sqrt(2 * self.cfg.n_layer)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_resid = name.endswith("o_proj") or name.endswith("mlp.proj")
                nn.init.normal_(module.weight, mean=0.0, std=resid_std if is_resid else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ forward
    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """idx: (B, T) token ids (or (B, T, C) hidden states on a later pipeline stage)."""
        if self.tok_emb is not None:
            T = idx.shape[1]
            if T > self.cfg.block_size:
                raise ValueError(f"sequence length {T} exceeds model block_size {self.cfg.block_size}")
            pos = torch.arange(T, device=idx.device)
            h = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, T, C)
        else:
            h = idx  # (B, T, C) from the previous stage
        for layer in self.layers.values():
            h = layer(h)  # (B, T, C)
        if self.lm_head is None:
            return h  # intermediate pipeline stage
        h = self.norm(h)
        logits = self.lm_head(h)  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))
        return logits, loss

    # ------------------------------------------------------------------ helpers
    def num_params(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and self.pos_emb is not None:
            n -= self.pos_emb.weight.numel()
        return n

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Model FLOPs per token, PaLM appendix B: 6N + 12*l*h*s, N = the parameters of matmuls:
        without the token and position embeddings (lookups, no FLOPs; nanoGPT's 6N keeps the token
        embedding only because its lm_head shares that weight; here the lm_head is its own and is
        counted). Forward and backward matmuls, no recompute."""
        s = seq_len or self.cfg.block_size
        n = self.num_params(exclude_embeddings=True)
        if self.tok_emb is not None:
            n -= self.tok_emb.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * self.cfg.n_embd * s

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.8, top_k: int | None = 40,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Sample continuation tokens for idx (B, T)."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.cfg.block_size:]
            logits, _ = self(ctx)
            logits = logits[:, -1, :].float() / max(temperature, 1e-5)  # (B, V)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, nxt), dim=1)
        return idx
