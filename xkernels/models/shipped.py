"""The models shipped in the package (xkernels/models/weights/): saving and loading."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file, save_file

from ..refiner import XPressRefiner
from .block_diffusion import BlockDiffusionConfig, BlockDiffusionLM
from .drafter import BlockDrafter, DrafterConfig
from .target import TargetConfig, TargetLM

WEIGHTS = Path(__file__).parent / "weights"


def save(module: torch.nn.Module, config: dict, name: str, folder: Path = WEIGHTS) -> None:
    """Weights as float16 safetensors (half the bytes; loaded back as float32) and the config as JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(folder / f"{name}.safetensors"))
    (folder / f"{name}.json").write_text(json.dumps(config, indent=1))


def _load(module: torch.nn.Module, name: str, folder: Path) -> torch.nn.Module:
    state = {k: v.float() for k, v in load_file(str(folder / f"{name}.safetensors")).items()}
    module.load_state_dict(state)
    return module.eval()


def load_config(name: str, folder: Path = WEIGHTS) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def load_target(folder: Path = WEIGHTS) -> TargetLM:
    """The shipped target LM (float32, on the CPU)."""
    return _load(TargetLM(TargetConfig(**load_config("target", folder))), "target", folder)


def load_drafter(folder: Path = WEIGHTS) -> BlockDrafter:
    """The shipped block drafter of the target (its cfg.target_layers: the target layers it reads)."""
    cfg = load_config("drafter", folder)
    cfg["target_layers"] = tuple(cfg["target_layers"])
    return _load(BlockDrafter(DrafterConfig(**cfg)), "drafter", folder)


def load_refiner(folder: Path = WEIGHTS) -> XPressRefiner:
    """The shipped xPress refiner of the drafter (fold() gives the ops' RefinerWeights)."""
    return _load(XPressRefiner(**load_config("refiner", folder)), "refiner", folder)


def load_block_diffusion(folder: Path = WEIGHTS) -> BlockDiffusionLM:
    """The block diffusion LM of xkernels.decoding.dllm_generate (mask token: its cfg.mask_id)."""
    return _load(BlockDiffusionLM(BlockDiffusionConfig(**load_config("block_diffusion", folder))), "block_diffusion",
                 folder)


def load_tokenizer(folder: Path = WEIGHTS):
    """The shipped byte-level BPE tokenizer (a tokenizers.Tokenizer), shared by every shipped model."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(folder / "tokenizer.json"))


@dataclass
class ShippedModels:
    tokenizer: object
    target: TargetLM
    drafter: Optional[BlockDrafter]
    refiner: Optional[XPressRefiner]

    def to(self, device) -> "ShippedModels":
        """The models moved to device (in place, as nn.Module.to), the tokenizer as it is."""
        for model in (self.target, self.drafter, self.refiner):
            if model is not None:
                model.to(device)
        return self


def load_all(folder: Path = WEIGHTS) -> ShippedModels:
    """The tokenizer, target, drafter and refiner together."""
    return ShippedModels(load_tokenizer(folder), load_target(folder), load_drafter(folder), load_refiner(folder))
