from .drafter import BlockDrafter, DrafterConfig
from .target import KVCache, TargetConfig, TargetLM

__all__ = ["BlockDrafter", "DrafterConfig", "KVCache", "TargetConfig", "TargetLM"]
