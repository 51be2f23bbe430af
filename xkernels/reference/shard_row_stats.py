"""Reference of shard_row_stats, the per-shard pass of vocabulary-parallel sampling
(xkernels/distributed.py merges the shards)."""

import math

import torch

from .rng import _as_int, gumbel_noise_of_ids, inverse_temperature


def shard_row_stats(logits, vocab_start, rows=None, exclude=None, draft_probs=None, residual_stats=None, ignore_id=-1,
                    sample=False, raw_stats=False, temperature=0.0, seed=0, offset=0):
    """The per-shard pass of vocabulary-parallel sampling; see xkernels.ops.shard_row_stats."""
    n, r, v = logits.shape
    inv_t = inverse_temperature(temperature)
    if sample and inv_t == 0:
        raise ValueError("sample=True needs temperature > 0")
    seed, offset = _as_int(seed), _as_int(offset)
    l = logits.detach().cpu().float()
    rows = torch.arange(r).expand(n, r) if rows is None else rows.cpu()
    ids = torch.arange(vocab_start, vocab_start + v)
    shape = rows.shape
    row_max, row_sum = torch.full(shape, -math.inf), torch.zeros(shape)
    top_id, pick_id = torch.full(shape, -1, dtype=torch.int64), torch.full(shape, -1, dtype=torch.int64)
    pick_score, pick_logit = torch.full(shape, -math.inf), torch.full(shape, -math.inf)
    for s in range(n):
        for j in range(shape[1]):
            row = int(rows[s, j])
            raw = torch.where(ids == ignore_id, -math.inf, l[s, row])
            a = raw * inv_t if inv_t else raw
            stat = raw if raw_stats else a
            if v == 0:
                continue
            top = int(stat.argmax())  # NaN first, ties to the lowest id
            row_max[s, j], top_id[s, j] = stat[top], vocab_start + top
            if math.isfinite(float(stat[top])):
                row_sum[s, j] = torch.exp(stat - stat[top]).sum()
            if not sample:
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
            score = torch.where(drawable, log_w + gumbel_noise_of_ids(seed, offset, s, row, ids), -math.inf)
            best = int(score.argmax())
            pick_score[s, j], pick_id[s, j], pick_logit[s, j] = score[best], vocab_start + best, stat[best]
    dev = logits.device
    return tuple(t.to(dev) for t in (row_max, row_sum, top_id, pick_score, pick_id, pick_logit))
