"""Plain PyTorch references: what each op means, in code one can read.

The kernels must agree with these. They use the package's Philox stream (keyed as
in csrc/include/xkernels/philox.h), so at temperature > 0 they draw the same
tokens as the kernels for the same (seed, offset). One file per op family;
every name is re-exported here, so `xkernels.reference.X` reaches any of them.
"""

from .chain import chain_verify
from .dllm import dllm_step
from .param_errors import param_errors, read_as_off
from .refine import (_drafted_slots, _prev_tokens, jacobi_iterate, jacobi_refine, perturbed_scores, refine_logits,
                     refine_step, sample_rows, sequential_refine)
from .rng import (COIN_DRAW, _as_int, acceptance_coins, acceptance_coins_at, gumbel_noise, gumbel_noise_of_ids,
                  inverse_temperature, philox4x32_10, philox_draw, uniform_open)
from .shard_cut import shard_cut_candidates, shard_cut_histogram, shard_cut_pick
from .shard_row_stats import shard_row_stats
from .spiffy import SPIFFY_MAX_RANK, spiffy_accept, spiffy_attention_mask, spiffy_materialize
from .tree import (build_draft_tree, build_draft_tree_with_mask, compact_kv, tree_attention_mask, tree_positions,
                   tree_verify)

__all__ = ["COIN_DRAW", "SPIFFY_MAX_RANK", "acceptance_coins", "acceptance_coins_at", "build_draft_tree",
           "build_draft_tree_with_mask", "chain_verify",
           "compact_kv", "dllm_step", "gumbel_noise", "gumbel_noise_of_ids", "inverse_temperature", "jacobi_iterate",
           "jacobi_refine", "param_errors", "perturbed_scores", "philox4x32_10", "philox_draw", "read_as_off",
           "refine_logits", "refine_step",
           "sample_rows", "sequential_refine", "shard_cut_candidates", "shard_cut_histogram", "shard_cut_pick",
           "shard_row_stats",
           "spiffy_accept", "spiffy_attention_mask", "spiffy_materialize", "tree_attention_mask", "tree_positions",
           "tree_verify", "uniform_open"]
