"""SGLang's tree verification signatures (`sgl_kernel.speculative`) over the xkernels tree format.

SGLang holds a tree per request as first-child / next-sibling lists (`retrive_next_token`,
`retrive_next_sibling`, -1 for none) over `num_draft` nodes, node 0 the root, with each node's
token in `candidates` and its flat slot in `retrive_index`; results go into caller buffers.
`tree_from_sglang` turns the lists into xkernels' `parents` on the device, without a host sync.
"""

import torch

from .. import ops


def tree_from_sglang(candidates: torch.Tensor, retrive_next_token: torch.Tensor,
                     retrive_next_sibling: torch.Tensor):
    """xkernels' ``(tokens, parents)`` (int64 ``[bs, num_draft]``) of SGLang's lists.

    Args:
        candidates: int64 ``[bs, num_draft]``, each node's token.
        retrive_next_token: int64 ``[bs, num_draft]``, each node's first child (-1: none).
        retrive_next_sibling: int64 ``[bs, num_draft]``, each node's next sibling (-1: none).

    Returns:
        ``tokens`` (``candidates`` as int64) and ``parents`` (-1 for the root and for nodes no list
        reaches). Children must come after their parent and siblings in increasing index order, as
        SGLang builds them (xkernels' trees are in topological order and a node's children rank by
        index); on the CPU, lists that break this raise a RuntimeError naming the argument. A first child's parent
        is where its link starts; a later sibling shares the parent of its chain's head, found by
        pointer doubling: ``ceil(log2(num_draft))`` rounds of gathers, nothing read on the host.
    """
    bs, m = candidates.shape
    device = candidates.device
    nxt, sib = retrive_next_token.long(), retrive_next_sibling.long()
    if device.type == "cpu":  # asserted in C++: no Python read of a tensor, the same path as on CUDA
        index = torch.arange(m)
        torch._assert_async(~(((nxt >= 0) & (nxt <= index)) | (nxt >= m)).any(),
                            "retrive_next_token must point past each node (children after their parent), below "
                            "num_draft")
        torch._assert_async(~(((sib >= 0) & (sib <= index)) | (sib >= m)).any(),
                            "retrive_next_sibling must point past each node (siblings in index order), below num_draft")
    node = torch.arange(m, device=device).expand(bs, m)
    # Column m catches the writes of -1 links.
    parents = torch.full((bs, m + 1), -1, dtype=torch.int64, device=device)
    parents.scatter_(1, torch.where(nxt >= 0, nxt, m), node)
    left = torch.cat([node, node.new_full((bs, 1), m)], 1)  # each node's left sibling, itself if none
    left.scatter_(1, torch.where(sib >= 0, sib, m), node)
    parents, left = parents[:, :m], left[:, :m]
    for _ in range(max(m - 1, 1).bit_length()):  # a chain has at most m - 1 links
        parents = torch.where(parents >= 0, parents, parents.gather(1, left))
        left = left.gather(1, left)
    return candidates.long(), parents.contiguous()


def _write_at_slots(predicts, slots, values, mask):
    """predicts.view(-1)[slots] = values where mask, in place, with no host read."""
    flat = predicts.view(-1)
    padded = torch.cat([flat, flat.new_zeros(1)])  # masked writes land in the extra element
    padded.scatter_(0, torch.where(mask, slots, flat.numel()).reshape(-1), values.reshape(-1).to(predicts.dtype))
    flat.copy_(padded[:-1])


def _write_path(predicts, accept_index, accept_token_num, retrive_index, accept_len, path, emitted):
    """SGLang's outputs of a walk, in place: accept_index[:, d] = the flat slot of the path's d-th
    node (d <= accept_len; the caller's -1 elsewhere), predicts at that slot = the token emitted
    after the node (emitted[:, d]), accept_token_num = accept_len."""
    width = min(accept_index.shape[1], path.shape[1])
    on_path = torch.arange(width, device=path.device)[None] <= accept_len[:, None]
    slots = retrive_index.long().gather(1, path[:, :width].clamp(min=0))
    accept_index[:, :width] = torch.where(on_path, slots.to(accept_index.dtype), accept_index[:, :width])
    _write_at_slots(predicts, slots, emitted[:, :width], on_path)
    accept_token_num.copy_(accept_len.to(accept_token_num.dtype))
    return predicts, accept_index, accept_token_num


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict):
    """SGLang's greedy tree walk, in place, as one :func:`xkernels.tree_verify` call.

    Args:
        predicts: int32 ``[bs * num_draft]``, written at the flat slot of each accepted node (and
            the root) with the target's prediction there.
        accept_index: int32 ``[bs, num_spec_step]``, filled by the caller with -1; entry ``d`` gets
            the flat slot of the ``d``-th accepted node (entry 0: the root).
        accept_token_num: int32 ``[bs]``, the accepted drafts.
        candidates: int64 ``[bs, num_draft]``, each node's token.
        retrive_index: int64 ``[bs, num_draft]``, each node's flat slot.
        retrive_next_token: int64 ``[bs, num_draft]``, first children (see :func:`tree_from_sglang`).
        retrive_next_sibling: int64 ``[bs, num_draft]``, next siblings.
        target_predict: int64 ``[bs * num_draft]`` (or ``[bs, num_draft]``), the target's argmax
            at each flat slot.

    Returns:
        ``(predicts, accept_index, accept_token_num)``, the buffers written.

    From the root, each step accepts the first child (in sibling order) whose token is the
    target's prediction at the last accepted node, for at most ``num_spec_step - 1`` steps. SGLang
    gives predictions, not logits: each node's token becomes 0 where it is its parent's prediction
    and 1 elsewhere, and the kernel walks a two-id vocabulary whose argmax is 0 in every row (a
    ``[bs, num_draft, 2]`` constant), so it takes the same children. No host read.
    """
    bs, m = candidates.shape
    device = candidates.device
    _, parents = tree_from_sglang(candidates, retrive_next_token, retrive_next_sibling)
    predicted = target_predict.reshape(-1).long().take(retrive_index.long())  # [bs, m]: the prediction after a node
    match = candidates.long() == predicted.gather(1, parents.clamp(min=0))
    logits = torch.zeros(bs, m, 2, device=device)
    logits[..., 1] = -1.0
    accept_len, path, _ = ops.tree_verify(torch.where(match, 0, 1), parents, logits)
    accept_len = accept_len.clamp(max=accept_index.shape[1] - 1)  # SGLang's walk stops there
    return _write_path(predicts, accept_index, accept_token_num, retrive_index, accept_len, path,
                       predicted.gather(1, path.clamp(min=0)))


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single: float = 1.0, threshold_acc: float = 1.0,
                                          deterministic: bool = True, *, seed=0, offset=0):
    """SGLang's target-only tree sampling, lossless, through :func:`xkernels.tree_verify`, in place.

    Args:
        predicts: as for :func:`verify_tree_greedy`; the last accepted node's slot gets the
            sampled correction or bonus token.
        accept_index: as for :func:`verify_tree_greedy`.
        accept_token_num: as for :func:`verify_tree_greedy`.
        candidates: as for :func:`verify_tree_greedy`.
        retrive_index: as for :func:`verify_tree_greedy`.
        retrive_next_token: as for :func:`verify_tree_greedy`.
        retrive_next_sibling: as for :func:`verify_tree_greedy`.
        uniform_samples: accepted for the signature; the coins come from the package's Philox
            stream of ``seed`` and ``offset``.
        uniform_samples_for_final_sampling: likewise unused (the final draw is a Gumbel-max).
        target_probs: float32 ``[bs, num_draft, V]``, the target's (processed) distribution after
            each node.
        draft_probs: float32 ``[bs, num_draft, V]``; SGLang passes zeros (target-only): the
            children are deterministic proposals. Left unchanged.
        threshold_single: must be 1 (exact verification); other values raise.
        threshold_acc: must be 1 likewise.
        deterministic: accepted for compatibility; xkernels is always deterministic.
        seed: the Philox stream's seed (as for :func:`xkernels.tree_verify`).
        offset: its offset.

    Returns:
        ``(predicts, accept_index, accept_token_num)``, the buffers written.

    Where it differs: SGLang's relaxations (thresholds other than 1) are not lossless and are
    refused; the probabilities are verified as the distribution ``log(target_probs)`` gives; the
    random numbers are the package's, so the same inputs give other (equally distributed) tokens;
    duplicate sibling tokens cannot count twice (SGLang's kernel assumes distinct siblings). The log
    is one float32 pass over ``target_probs`` (read and write) before the kernel. The walk is not cut
    at ``num_spec_step - 1`` steps (a cut would change the distribution): SGLang's trees, of depth
    ``num_spec_step - 1``, never reach it. No host read: with ``seed`` and ``offset`` as tensors on
    the device, the call is CUDA-graph capturable.
    """
    if threshold_single != 1.0 or threshold_acc != 1.0:
        raise ValueError(f"threshold_single and threshold_acc must be 1 (exact verification), got "
                         f"{threshold_single} and {threshold_acc}")
    tokens, parents = tree_from_sglang(candidates, retrive_next_token, retrive_next_sibling)
    accept_len, path, out = ops.tree_verify(tokens, parents, torch.log(target_probs.float()), temperature=1.0,
                                            seed=seed, offset=offset)
    return _write_path(predicts, accept_index, accept_token_num, retrive_index, accept_len, path, out)
