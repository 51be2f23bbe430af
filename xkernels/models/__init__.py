from .block_diffusion import BlockDiffusionConfig, BlockDiffusionLM
from .drafter import BlockDrafter, DrafterConfig
from .static_cache import StaticKVCache
from .target import KVCache, TargetConfig, TargetLM

__all__ = ["BlockDiffusionConfig", "BlockDiffusionLM", "BlockDrafter", "DrafterConfig", "KVCache", "StaticKVCache", "TargetConfig", "TargetLM"]
