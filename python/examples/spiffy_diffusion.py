"""Spiffy on the shipped block diffusion LM: the same tokens as vanilla decoding (one unmasking
step per model call), with fewer model calls, at any temperature.

Run: python python/examples/spiffy_diffusion.py
"""

import torch

from xkernels.decoding import dllm_generate
from xkernels.models.shipped import load_block_diffusion, load_tokenizer
from xkernels.spiffy import SpiffyConfig, shipped_graph

model, tok = load_block_diffusion().eval(), load_tokenizer()
prompt = torch.tensor(tok.encode("Ava has 3 apples and buys 4 more. How many apples does Ava have?\n").ids)
config = SpiffyConfig(shipped_graph(), keep=8)  # the calibrated draft graph; 8 drafts verified per call

for temperature in (0.0, 0.8):
    vanilla, v_stats = dllm_generate(model, prompt, 32, block_size=32, temperature=temperature, seed=1)
    spiffy, s_stats = dllm_generate(model, prompt, 32, block_size=32, temperature=temperature, seed=1,
                                    spiffy=config)
    assert torch.equal(vanilla, spiffy), "Spiffy is lossless: the tokens equal vanilla's"
    print(f"T={temperature}: {v_stats.model_calls} model calls vanilla, {s_stats.model_calls} with Spiffy;"
          f" {tok.decode(spiffy.tolist())!r}")
