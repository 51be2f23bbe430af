from .generate import MODES, Stats, generate

__all__ = ["MODES", "Stats", "generate"]
