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
        index); on the CPU, lists that break this raise naming the argument. The conversion is a
        fixed sequence of ``num_draft`` scatters, so it reads nothing on the host.
    """
    bs, m = candidates.shape
    nxt, sib = retrive_next_token.long(), retrive_next_sibling.long()
    if candidates.device.type == "cpu":
        index = torch.arange(m)
        if ((nxt >= 0) & (nxt <= index)).any() or (nxt >= m).any():
            raise ValueError("retrive_next_token must point past each node (children after their parent), below num_draft")
        if ((sib >= 0) & (sib <= index)).any() or (sib >= m).any():
            raise ValueError("retrive_next_sibling must point past each node (siblings in index order), below num_draft")
    # Column m catches the writes of -1 links.
    parents = torch.full((bs, m + 1), -1, dtype=torch.int64, device=candidates.device)
    node = torch.arange(m, device=candidates.device).expand(bs, m)
    parents.scatter_(1, torch.where(nxt >= 0, nxt, m), node)
    for _ in range(m - 1):  # a sibling inherits its left neighbour's parent, one link a step
        current = parents[:, :m]
        parents.scatter_(1, torch.where((sib >= 0) & (current >= 0), sib, m), current)
    return candidates.long(), parents[:, :m].contiguous()


def _write_at_slots(predicts, slots, values, mask):
    """predicts.view(-1)[slots] = values where mask, in place, with no host read."""
    flat = predicts.view(-1)
    padded = torch.cat([flat, flat.new_zeros(1)])  # masked writes land in the extra element
    padded.scatter_(0, torch.where(mask, slots, flat.numel()).reshape(-1), values.reshape(-1).to(predicts.dtype))
    flat.copy_(padded[:-1])


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict):
    """SGLang's greedy tree walk, in place.

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
    target's prediction at the last accepted node, for at most ``num_spec_step - 1`` steps. The
    walk runs as ``num_spec_step`` steps of tensor ops (no host read), after the layout
    conversion of :func:`tree_from_sglang`.
    """
    bs, m = candidates.shape
    steps = accept_index.shape[1]
    _, parents = tree_from_sglang(candidates, retrive_next_token, retrive_next_sibling)
    slots = retrive_index.long()
    predicted = target_predict.reshape(-1).long()[slots]  # [bs, m]: the prediction after each node
    parent_prediction = predicted.gather(1, parents.clamp(min=0))
    match = (parents >= 0) & (candidates.long() == parent_prediction)
    # chosen[b, p]: the first child of p that matches (m: none)
    chosen = torch.full((bs, m + 1), m, dtype=torch.int64, device=candidates.device)
    chosen.scatter_reduce_(1, torch.where(match, parents, m), torch.arange(m, device=candidates.device).expand(bs, m),
                           reduce="amin")
    current = torch.zeros(bs, dtype=torch.int64, device=candidates.device)
    alive = torch.ones(bs, dtype=torch.bool, device=candidates.device)
    count = torch.zeros(bs, dtype=torch.int64, device=candidates.device)
    accept_index[:, 0] = slots[:, 0].to(accept_index.dtype)
    visited = [current]
    for step in range(1, steps):
        nxt = chosen.gather(1, current[:, None])[:, 0]
        ok = alive & (nxt < m)
        nxt_slot = slots.gather(1, nxt.clamp(max=m - 1)[:, None])[:, 0]
        accept_index[:, step] = torch.where(ok, nxt_slot.to(accept_index.dtype), accept_index[:, step])
        count += ok.long()
        current = torch.where(ok, nxt, current)
        alive &= ok
        visited.append(torch.where(ok, nxt, -1))
    # every node of the path, root included, gets the target's prediction after it
    nodes = torch.stack(visited, 1)
    _write_at_slots(predicts, slots.gather(1, nodes.clamp(min=0)), predicted.gather(1, nodes.clamp(min=0)), nodes >= 0)
    accept_token_num.copy_(count.to(accept_token_num.dtype))
    return predicts, accept_index, accept_token_num


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
    duplicate sibling tokens cannot count twice (SGLang's kernel assumes distinct siblings).
    """
    if threshold_single != 1.0 or threshold_acc != 1.0:
        raise ValueError(f"threshold_single and threshold_acc must be 1 (exact verification), got "
                         f"{threshold_single} and {threshold_acc}")
    bs, m = candidates.shape
    tokens, parents = tree_from_sglang(candidates, retrive_next_token, retrive_next_sibling)
    accept_len, path, out = ops.tree_verify(tokens, parents, torch.log(target_probs.float()), temperature=1.0,
                                            seed=seed, offset=offset)
    steps = accept_index.shape[1]
    width = min(steps, m)
    depth = torch.arange(width, device=candidates.device)[None]
    on_path = depth <= accept_len[:, None]
    slots = retrive_index.long().gather(1, path[:, :width].clamp(min=0))
    accept_index[:, :width] = torch.where(on_path, slots.to(accept_index.dtype), accept_index[:, :width])
    _write_at_slots(predicts, slots, out[:, :width], on_path)
    accept_token_num.copy_(accept_len.to(accept_token_num.dtype))
    return predicts, accept_index, accept_token_num
