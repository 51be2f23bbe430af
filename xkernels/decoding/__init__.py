from .batch import BatchStats, generate_batch
from .dllm import DllmStats, dllm_generate
from .dllm_batch import dllm_generate_batch
from .draft_length import CostModel
from .generate import MODES, Stats, generate

__all__ = ["MODES", "Stats", "generate", "BatchStats", "generate_batch", "CostModel", "DllmStats", "dllm_generate", "dllm_generate_batch"]
