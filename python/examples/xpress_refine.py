"""xPress refinement of a drafter's block: the shipped block drafter proposes a block after a
prompt, the shipped refiner corrects each slot given the drafts before it (Jacobi iteration, or
slot by slot), and the target verifies both proposals with chain_verify.

Run: python python/examples/xpress_refine.py
"""

import torch

import xkernels
from xkernels import data
from xkernels.decoding.modes import draft_block
from xkernels.models.shipped import load_drafter, load_refiner, load_target, load_tokenizer
from xkernels.models.target import KVCache

target, drafter, refiner, tok = load_target().eval(), load_drafter().eval(), load_refiner().eval(), load_tokenizer()
layers = drafter.cfg.target_layers
prompt = torch.tensor([tok.encode(data.held_out_prompts("math", 1)[0]).ids])  # a word problem, then "Answer:"

with torch.no_grad():
    # The target reads the prompt but its last token (the anchor); the drafter's context is the
    # target's features at the layers it was trained on.
    cache = target.new_cache()
    _, hidden = target(prompt[:, :-1], cache, hidden_layers=layers)
    context = KVCache(len(drafter.layers))
    positions = torch.arange(prompt.shape[1] - 1)
    for i, (k, v) in enumerate(drafter.context(torch.cat(hidden, -1), positions)):
        context.append(i, k, v)
    # One drafter pass over [anchor, MASK ...]: base logits [N, D, V] (D = block - 1) and states h.
    anchor = prompt[:, -1]
    base_logits, h = draft_block(drafter, target, anchor, list(zip(context.k, context.v)), torch.float32,
                                 start=prompt.shape[1] - 1)
    ctx = refiner.prepare(h).float()  # [N, B, r]: what every refinement pass shares
    weights = refiner.fold().to(torch.float32)  # xkernels.RefinerWeights
    prefix = prompt[:, -2:]  # [N, F + 1]: the token before the block, and the anchor (the fixed slot)

    drafter_only = base_logits.argmax(-1)  # [N, D]
    refined, logprobs, iters = xkernels.jacobi_refine(ctx, prefix, base_logits, weights, max_iters=4)
    sequential, _ = xkernels.sequential_refine(ctx, prefix, base_logits, weights)

    # Verify each proposal: the target over [anchor, drafts] after the cached prefix.
    for name, drafts in [("drafter alone", drafter_only), ("xPress (Jacobi)", refined)]:
        logits, _ = target(torch.cat([anchor[:, None], drafts], 1), cache)
        cache.crop(prompt.shape[1] - 1)  # forget the block: the next proposal reuses the prefix
        accept_len, out = xkernels.chain_verify(drafts, logits)
        print(f"{name}: {int(accept_len[0])} of {drafts.shape[1]} drafts accepted,"
              f" {tok.decode(out[0, : accept_len[0] + 1].tolist())!r}")

print("Jacobi passes:", iters.tolist(), "(converged: equals sequential)" if torch.equal(refined, sequential) else "")
