"""A transformers causal LM as the target of the decoding loop: the shipped target exported as a
Qwen3 model, loaded with AutoModelForCausalLM, and decoded with the shipped drafter and refiner.
Greedy speculative decoding emits exactly transformers' own greedy tokens.

Run: python python/examples/transformers_target.py   (needs transformers: pip install ".[hf]")
"""

import tempfile

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from xkernels.decoding import generate
from xkernels.models import hf, shipped

with tempfile.TemporaryDirectory() as folder:
    hf.export_all(folder)  # or: python -m xkernels export-hf FOLDER
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)

prompt = tok("def add(a, b):")["input_ids"]
tokens, stats = generate(model, prompt, 32, mode="jacobi", drafter=shipped.load_drafter(),
                         refiner=shipped.load_refiner())
print(f"{stats.target_calls} target calls for {len(tokens)} tokens: {tok.decode(tokens)!r}")

with torch.no_grad():
    want = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False)[0, len(prompt):]
assert tokens == want.tolist(), "greedy speculative decoding emits transformers' greedy tokens"
