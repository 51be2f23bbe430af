"""Verify a batch of drafted chains with chain_verify: greedy, then sampled with the drafts' own
distributions (lossless: the emitted tokens follow the target's distribution exactly).

The shipped target gives the logits; a stand-in drafter (the target itself at a higher
temperature) proposes K = 4 tokens per sequence.  Run: python python/examples/verify_batch.py
"""

import torch

import xkernels
from xkernels import reference
from xkernels.models.shipped import load_target, load_tokenizer

K, TEMPERATURE = 4, 1.0
device = "cuda" if torch.cuda.is_available() else "cpu"
target, tok = load_target().to(device).eval(), load_tokenizer()
prompts = ["def add(a, b):", "Ava has 3 apples and buys", "import os\nimport"]
ids = [tok.encode(p).ids for p in prompts]
length = min(map(len, ids))
context = torch.tensor([x[-length:] for x in ids], device=device)  # [N, P]: one length, no padding here

with torch.no_grad():
    # The drafter: K tokens sampled one by one from q (here: the target at temperature 1.5).
    drafts, q_rows = [], []
    for _ in range(K):
        logits, _ = target(torch.cat([context] + drafts, 1))
        q = torch.softmax(logits[:, -1].float() / 1.5, -1)
        drafts.append(torch.multinomial(q, 1))
        q_rows.append(q)
    draft_tokens = torch.cat(drafts, 1)  # int64 [N, K]
    draft_probs = torch.stack(q_rows, 1)  # float32 [N, K, V]
    # The target's logits after the prefix plus the first i drafts, i = 0..K: one forward.
    target_logits = target(torch.cat([context, draft_tokens], 1))[0][:, -K - 1:]  # [N, K+1, V]

# Greedy: a draft is accepted while it equals the target's argmax.
accept_len, out_tokens = xkernels.chain_verify(draft_tokens, target_logits)
print("greedy accepted:", accept_len.tolist())

# Sampled: each sequence's own Philox stream, int64 [N] tensors on the device: its seed, and where
# this call's slots start (the next call's offset moves on by xkernels.offset_advance: K + 1).
seed = torch.tensor([1234, 99, 7], device=device)
offset = torch.zeros(len(prompts), dtype=torch.int64, device=device)
accept_len, out_tokens = xkernels.chain_verify(draft_tokens, target_logits, draft_probs=draft_probs,
                                               temperature=TEMPERATURE, seed=seed, offset=offset)
for n, prompt in enumerate(prompts):
    emitted = out_tokens[n, : accept_len[n] + 1].tolist()  # the accepted drafts, then one more token
    print(f"{prompt!r}: accepted {int(accept_len[n])} of {K}, emitted {tok.decode(emitted)!r}")

# The plain PyTorch reference draws from the same stream: the same tokens, exactly.
want = reference.chain_verify(draft_tokens, target_logits, draft_probs, TEMPERATURE, seed, offset)
assert torch.equal(out_tokens, want[1]) and torch.equal(accept_len, want[0])
