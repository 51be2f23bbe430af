"""Verify a draft tree that an engine keeps as first-child / next-sibling links.

xkernels' tree format is a parents array in topological order (xkernels/tree.py). An engine's
layout with first_child[i] and next_sibling[i] (-1: none), nodes numbered in pre-order, converts
in one pass. Then: the attention mask and positions for the target's forward over the tree, the
lossless walk (tree_verify), and the KV cache compacted to the accepted path (compact_kv_).
Run: python python/examples/tree_from_layout.py
"""

import torch

import xkernels
from xkernels import reference
from xkernels.models.shipped import load_target, load_tokenizer


def parents_from_links(first_child, next_sibling):
    """parents[i] of a tree given as first-child / next-sibling links (node 0 the root)."""
    parents = [-1] * len(first_child)
    for node, child in enumerate(first_child):
        while child != -1:  # the node's children: its first child and that child's next siblings
            parents[child] = node
            child = next_sibling[child]
    return parents


target, tok = load_target().eval(), load_tokenizer()
prompt = torch.tensor([tok.encode("def add(a, b):\n    return").ids])
# The engine's tree: the root (the last committed token) with three candidates for the next token,
# the first of which has two candidates after it. Pre-order numbering: parents come first.
words = [None, " a", " b", " sum", " +", " -"]  # node 0's token is the prompt's last one
first_child = [1, 4, -1, -1, -1, -1]
next_sibling = [-1, 2, 3, -1, 5, -1]
parents = torch.tensor([parents_from_links(first_child, next_sibling)])  # [[-1, 0, 0, 0, 1, 1]]
tokens = torch.tensor([[prompt[0, -1].item()] + [tok.encode(w).ids[0] for w in words[1:]]])

mask = xkernels.tree_attention_mask(parents)  # bool [N, M, M]; layout="packed" for FlashInfer-style bits
depth = xkernels.tree_positions(parents)  # [N, M]: rotary positions after the prefix
with torch.no_grad():
    cache = target.new_cache()
    target(prompt[:, :-1], cache)  # the prefix, cached; the root is the prompt's last token
    prefix_len = cache.length
    logits, _ = target(tokens, cache, tree_mask=mask, tree_depth=depth)  # [N, M, V]

accept_len, path, out_tokens = xkernels.tree_verify(tokens, parents, logits)  # greedy
print("parents:", parents.tolist()[0])
print("accepted", int(accept_len[0]), "nodes on the path", path[0, : accept_len[0] + 1].tolist(),
      "emitting", repr(tok.decode(out_tokens[0, : accept_len[0] + 1].tolist())))

# The cache holds prefix + M tree entries. An engine's own [N, H, L, d] buffer keeps the root and the
# accepted nodes, in order, behind the prefix with compact_kv_ (in place); the model's cache does the
# same to each layer's buffers (keep_path).
engine_k = cache.k[0].clone()
xkernels.compact_kv_(engine_k, path, accept_len, prefix_len)
cache.keep_path(prefix_len, path, accept_len)
kept = prefix_len + int(accept_len[0]) + 1
assert cache.length == kept and torch.equal(cache.k[0], engine_k[:, :, :kept])

# The same walk at T > 0 with the default (deterministic children) rule, and its reference.
# The sequence's own stream ([N] tensors); a call reads its M slots, so the next call's offset moves
# on by xkernels.offset_advance(xkernels.tree_verify, tokens, seed=seed), i.e. M.
seed, offset = torch.tensor([3]), torch.tensor([0])
sampled = xkernels.tree_verify(tokens, parents, logits, temperature=1.0, seed=seed, offset=offset)
assert all(torch.equal(a, b) for a, b in zip(sampled, reference.tree_verify(
    tokens, parents, logits, temperature=1.0, seed=seed, offset=offset)))
