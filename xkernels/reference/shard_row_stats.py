"""Reference of shard_row_stats, the per-shard pass of vocabulary-parallel sampling
(xkernels/distributed.py merges the shards)."""

import math

import torch

from .param_errors import flagged
from .rng import gumbel_noise_of_ids, inverse_temperature
from .sampling import row_params, row_streams


def shard_row_stats(logits, vocab_start, rows=None, exclude=None, draft_probs=None, residual_stats=None, ignore_id=-1,
                    sample=False, raw_stats=False, temperature=0.0, seed=0, offset=0, cut_value=None, cut_id=None,
                    errors=None):
    """The per-shard pass of vocabulary-parallel sampling; see xkernels.ops.shard_row_stats.
    temperature: a float or an [N] tensor; seed, offset: ints, one-element tensors or [N] tensors (the
    per-request streams, sampling.RowStream); cut_value, cut_id [N, S]: each row keeps the ids ranked
    at or before its cut (filter_keeps) in its statistics (unless raw_stats) and its pick. errors
    (int32 [N]): each sequence's invalid temperature OR-ed into it (param_errors) and read as greedy,
    as the kernels do."""
    n, r, v = logits.shape
    params = row_params(n, flagged(errors, n, temperature)[0])
    if sample and not isinstance(temperature, torch.Tensor) and inverse_temperature(temperature) == 0:
        raise ValueError("sample=True needs temperature > 0")
    streams = row_streams(n, seed, offset)
    l = logits.detach().cpu().float()
    rows = torch.arange(r).expand(n, r) if rows is None else rows.cpu()
    ids = torch.arange(vocab_start, vocab_start + v)
    shape = rows.shape
    row_max, row_sum = torch.full(shape, -math.inf), torch.zeros(shape)
    top_id, pick_id = torch.full(shape, -1, dtype=torch.int64), torch.full(shape, -1, dtype=torch.int64)
    pick_score, pick_logit = torch.full(shape, -math.inf), torch.full(shape, -math.inf)
    for s in range(n):
        inv_t = params[s].inv_t
        for j in range(shape[1]):
            row = int(rows[s, j])
            raw = torch.where(ids == ignore_id, -math.inf, l[s, row])
            a = raw * inv_t if inv_t else raw
            if cut_value is not None and inv_t:  # ranked at or before (value, id): a higher value, ties to the lower id
                c_val, c_id = float(cut_value[s, j]), int(cut_id[s, j])
                a = torch.where((a > c_val) | ((a == c_val) & (ids <= c_id)), a, -math.inf)
            stat = raw if raw_stats else a
            if v == 0:
                continue
            top = int(stat.argmax())  # NaN first, ties to the lowest id
            row_max[s, j], top_id[s, j] = stat[top], vocab_start + top
            if math.isfinite(float(stat[top])):
                row_sum[s, j] = torch.exp(stat - stat[top]).sum()
            if not sample or not inv_t:
                continue
            if draft_probs is not None and row < draft_probs.shape[1]:
                big_m, big_s = (float(x) for x in residual_stats[s, j])
                w = torch.exp(a - big_m) / big_s - draft_probs[s, row].cpu().float()
                log_w = torch.where(w > 0, torch.log(w.clamp_min(1e-45)), -math.inf)
            else:
                log_w = a.clone()
            if exclude is not None:
                log_w[torch.isin(ids, exclude[s, j].cpu())] = -math.inf
            drawable = ~torch.isneginf(log_w)
            if not drawable.any():
                continue
            noise = gumbel_noise_of_ids(*streams[s]._at(row), ids)
            score = torch.where(drawable, log_w + noise, -math.inf)
            best = int(score.argmax())
            pick_score[s, j], pick_id[s, j], pick_logit[s, j] = score[best], vocab_start + best, stat[best]
    dev = logits.device
    return tuple(t.to(dev) for t in (row_max, row_sum, top_id, pick_score, pick_id, pick_logit))
