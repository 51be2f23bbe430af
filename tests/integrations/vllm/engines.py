"""vLLM's engine on the shipped target, as the engine tests here and bench/bench_vllm_xpress.py run
it: the held-out prompts, the engine's settings, and its model runner."""

import gc

from vllm import LLM

# New text, not from the training data (xkernels/data.py).
PROMPTS = [
    "def count_vowels(text):\n    total = 0\n    for ch in text:\n        if ch in 'aeiou':\n            total += 1\n"
    "    return total\n\n\ndef count_digits(text):\n    total = 0\n    for ch in text:\n",
    "class Queue:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def size(self):\n        return len(self.items)\n\n    def pop(self):\n",
    "Question: Omar has 14 bolts. Omar buys 9 more bolts. Then Omar gives away 5 bolts. "
    "How many bolts does Omar have now?\nAnswer:",
    "Question: Priya has 8 tickets. Priya gets 3 bags with 4 tickets in each bag. "
    "How many tickets does Priya have now?\nAnswer:",
]
TOKENS = 40


def engine(target, **kwargs):
    return LLM(model=target, max_model_len=512, max_num_seqs=8, seed=0, dtype="float32", **kwargs)


def model_runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def run(llm, prompts, params):
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def close(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def accepted_drafts(seen):
    """The accepted drafts of the verify calls the `verified` fixture (conftest.py) recorded."""
    return sum(max(n - 1, 0) for _, emitted, _ in seen for n in emitted)
