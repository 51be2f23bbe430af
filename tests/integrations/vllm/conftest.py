"""These tests need vLLM, which only the environment of run.sh (next to this file) has: the
main suite (tests/run.sh), whose environment has no vLLM, does not collect them."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, str(Path(__file__).parent))  # batches.py, shared with bench/bench_vllm_sampler.py


def pytest_collection_modifyitems(items):
    # The engine tests last: vLLM's CPU kernel registration (each engine's, and vllm_cpu_kernels'
    # in the engine-free tests) fails once the ngram proposer has imported numba (llvmlite).
    items.sort(key=lambda item: item.path.name == "test_vllm_engine.py")
