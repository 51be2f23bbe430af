"""Draft trees: the format the tree ops share, and attention masks for FlexAttention.

Per sequence a tree has nodes 0..M-1 in topological order; node 0 is the root (the last committed
token, whose logits give the first draft's distribution); `parents` int64 [N, M] has
parents[:, 0] = -1 and 0 <= parents[i] < i for the real nodes i < num_nodes (int64 [N], optional:
nodes at or past it are padding and ignored). `tokens` int64 [N, M] holds each node's token.

The ops (``xkernels.build_draft_tree``, ``tree_attention_mask``, ``tree_positions``, ``tree_verify``,
``compact_kv_``) take this format; a target forward over [root + tree] uses the mask below over the
cached prefix plus the tree, with positions prefix_len + tree_positions(parents).
"""

from typing import Optional

import torch

from .ops import tree_attention_mask


def tree_mask_mod(parents: torch.Tensor, prefix_len: int, num_nodes: Optional[torch.Tensor] = None):
    """A FlexAttention mask_mod over keys [prefix (prefix_len) + tree (M)] for tree queries: a node
    sees every prefix key, itself and its ancestors."""
    mask = tree_attention_mask(parents, num_nodes=num_nodes)

    def mask_mod(b, h, q_idx, kv_idx):
        node = kv_idx - prefix_len
        return (kv_idx < prefix_len) | ((node >= 0) & mask[b, q_idx, node.clamp(min=0)])

    return mask_mod


def tree_block_mask(parents: torch.Tensor, prefix_len: int, num_nodes: Optional[torch.Tensor] = None,
                    block_size: int = 128):
    """The FlexAttention BlockMask of tree_mask_mod: queries [N, M], keys [N, prefix_len + M]."""
    from torch.nn.attention.flex_attention import create_block_mask

    n, m = parents.shape
    return create_block_mask(tree_mask_mod(parents, prefix_len, num_nodes), B=n, H=None, Q_LEN=m,
                             KV_LEN=prefix_len + m, device=parents.device, BLOCK_SIZE=block_size)
