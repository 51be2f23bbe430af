"""The xPress refiner: a small causal model that adds a low-rank logit bias to a block drafter.

Slots 0..B-1 of a block; slot k reads the token of slot k-1 (slot 0 the token before the block).
    Fuse:  u_k = in_proj([down_h(h_k), down_g(g), w1[prev_k]])      g = mean_k h_k
    Mix:   u_k <- u_k + sum_{j<=k} L[c, k, j] u_j                     per channel c
    Trans: z = u + down(silu(gate(u)) * up(u))
    Read:  delta = w2(z);  refined logits = s + delta
`forward` is the training path (autograd). `fold` returns the inference weights the ops take.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


class RefinerWeights(NamedTuple):
    """Inference weights of a refiner (r = rank, H = hidden of the SwiGLU, B = block size).

    A pass is u = ctx + emb[prev]; u = mix u (per channel); z = u + w_down(silu(w_gate u) * w_up u);
    delta = w_read z."""

    emb: torch.Tensor  # [V, r]  w1 folded through the token third of in_proj
    mix: torch.Tensor  # [r, B, B]  L * tril + I
    w_gate: torch.Tensor  # [H, r]
    w_up: torch.Tensor  # [H, r]
    w_down: torch.Tensor  # [r, H]
    w_read: torch.Tensor  # [V, r]

    def to(self, *args, **kwargs) -> "RefinerWeights":
        return RefinerWeights(*(w.to(*args, **kwargs) for w in self))

    def first_slots(self, b: int) -> "RefinerWeights":
        """The weights of a block of the first b slots: the mix is causal, so those slots refine as
        they do in the whole block."""
        return self._replace(mix=self.mix[:, :b, :b].contiguous())


def apply_mix(mix: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """out[n, k, c] = sum_j mix[c, k, j] * u[n, j, c]."""
    return torch.einsum("ckj,njc->nkc", mix, u)


def refiner_hidden(weights: RefinerWeights, ctx: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
    """z [N, B, r] of one pass, in float32, from the folded weights (only the lower triangle of
    mix is read, so slot k never sees a later slot)."""
    w = [t.float() for t in weights]
    u = ctx.float() + w[0][prev_tokens]
    u = apply_mix(w[1].tril(), u)
    return u + F.linear(F.silu(F.linear(u, w[2])) * F.linear(u, w[3]), w[4])


class XPressRefiner(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, block_size: int, rank: int = 256, mlp_ratio: int = 2):
        super().__init__()
        self.vocab_size, self.block_size, self.rank = vocab_size, block_size, rank
        self.w1 = nn.Embedding(vocab_size, rank)
        self.down_h = nn.Linear(hidden_size, rank, bias=False)
        self.down_g = nn.Linear(hidden_size, rank, bias=False)
        self.in_proj = nn.Linear(3 * rank, rank, bias=False)
        self.mixer = nn.Parameter(torch.zeros(rank, block_size, block_size))  # L, used lower-triangular
        hidden = mlp_ratio * rank
        self.gate = nn.Linear(rank, hidden, bias=False)
        self.up = nn.Linear(rank, hidden, bias=False)
        self.down = nn.Linear(hidden, rank, bias=False)
        self.w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.w1.weight, std=rank**-0.5)
        nn.init.zeros_(self.w2.weight)  # starts as the identity refinement: logits = s

    def prepare(self, h: torch.Tensor) -> torch.Tensor:
        """The pass-invariant context ctx [N, B, r]: in_proj applied to [down_h(h), down_g(g)]."""
        g = h.mean(dim=1, keepdim=True).expand_as(h)
        hg = torch.cat([self.down_h(h), self.down_g(g)], dim=-1)
        return F.linear(hg, self.in_proj.weight[:, : 2 * self.rank])

    def delta(self, ctx: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """The logit bias of every slot, [N, B', V], for the first B' <= B slots of the block (the
        mix is causal: a slot's bias reads only the slots before it)."""
        u = ctx + F.linear(self.w1(prev_tokens), self.in_proj.weight[:, 2 * self.rank:])
        b = u.shape[1]
        u = u + apply_mix(self.mixer[:, :b, :b].tril(), u)
        z = u + self.down(F.silu(self.gate(u)) * self.up(u))
        return self.w2(z)

    def forward(self, base_logits: torch.Tensor, h: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Refined logits of the drafted slots (the last D = base_logits.shape[1] of the block).

        base_logits [N, D, V], h [N, B, hidden] (the drafter's hidden states), prev_tokens [N, B]."""
        d = base_logits.shape[1]
        return base_logits + self.delta(self.prepare(h), prev_tokens)[:, -d:]

    @torch.no_grad()
    def fold(self) -> RefinerWeights:
        eye = torch.eye(self.block_size, device=self.mixer.device, dtype=self.mixer.dtype)
        return RefinerWeights(
            emb=self.w1.weight @ self.in_proj.weight[:, 2 * self.rank:].T,
            mix=self.mixer.tril() + eye,
            w_gate=self.gate.weight.clone(),
            w_up=self.up.weight.clone(),
            w_down=self.down.weight.clone(),
            w_read=self.w2.weight.clone(),
        )
