"""xkernels: hand-written C++ and CUDA kernels for speculative decoding, as torch custom ops.

Importing the package loads libxkernels (which registers the ops under torch.ops.xkernels)
and the fake kernels that let torch.compile and FakeTensor trace them.
"""

import os
from pathlib import Path

import torch


def _load_library():
    # XKERNELS_LIBRARY loads another build of libxkernels (CI checks toolchain variants this way).
    override = os.environ.get("XKERNELS_LIBRARY")
    if override:
        torch.ops.load_library(override)
        return Path(override)
    here = Path(__file__).parent
    found = sorted(here.glob("libxkernels*.so"))
    if not found:
        raise ImportError(
            f"libxkernels was not found in {here}: build it with `pip install --no-build-isolation -e .`"
        )
    torch.ops.load_library(str(found[0]))
    return found[0]


_LIBRARY_PATH = _load_library()

from . import _fake  # noqa: E402,F401  (registers the fake kernels)
from .ops import (build_draft_tree, build_info, chain_verify, chain_verify_ragged, chain_verify_ragged_, compact_kv_, dllm_step, jacobi_refine,  # noqa: E402
                  refine_step, sequential_refine, shard_cut_candidates, shard_cut_histogram, shard_cut_pick, shard_row_stats,
                  spiffy_accept, spiffy_attention_mask, spiffy_materialize, tree_attention_mask, tree_positions, tree_verify)
from .refiner import RefinerWeights, XPressRefiner  # noqa: E402
from .streams import offset_advance  # noqa: E402

__version__ = "0.1.0"
# The public API: every op and class here has a generated page in the docs (docs/api), whose build
# fails on one without a docstring. The modules distributed, decoding, spiffy and tree are public too.
__all__ = ["build_info", "chain_verify", "chain_verify_ragged", "chain_verify_ragged_", "offset_advance", "refine_step", "jacobi_refine", "sequential_refine", "RefinerWeights",
           "XPressRefiner", "build_draft_tree", "tree_attention_mask", "tree_positions", "tree_verify", "compact_kv_",
           "dllm_step", "spiffy_materialize", "spiffy_accept", "spiffy_attention_mask", "shard_row_stats",
           "shard_cut_histogram", "shard_cut_pick", "shard_cut_candidates"]
