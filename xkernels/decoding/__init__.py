from .dllm import DllmStats, dllm_generate
from .draft_length import CostModel
from .generate import MODES, Stats, generate

__all__ = ["MODES", "Stats", "generate", "CostModel", "DllmStats", "dllm_generate"]
