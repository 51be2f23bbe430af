"""Fake (meta) kernels: output shapes and dtypes of each op, for FakeTensor and torch.compile.

They live in Python only; the library declares this module with set_python_module.
"""

import torch


@torch.library.register_fake("xkernels::chain_verify")
def _chain_verify_fake(draft_tokens, target_logits, draft_probs=None, temperature=0.0, seed=0, offset=0,
                       seed_tensor=None, offset_tensor=None):
    torch._check(draft_tokens.dim() == 2, lambda: "draft_tokens must have shape [N, K]")
    torch._check(target_logits.dim() == 3, lambda: "target_logits must have shape [N, K+1, V]")
    n, k = draft_tokens.shape
    torch._check(target_logits.shape[0] == n and target_logits.shape[1] == k + 1,
                 lambda: "target_logits must have shape [N, K+1, V]")
    accept_len = draft_tokens.new_empty((n,))
    out_tokens = draft_tokens.new_empty((n, k + 1))
    return accept_len, out_tokens
