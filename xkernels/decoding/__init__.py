from .dllm import DllmStats, dllm_generate
from .generate import MODES, Stats, generate

__all__ = ["MODES", "Stats", "generate", "DllmStats", "dllm_generate"]
