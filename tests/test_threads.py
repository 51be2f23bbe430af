import shutil
import subprocess

import pytest
import torch

import xkernels
from tests.test_refine import make_case, read  # noqa: F401  (read: the fixture forcing each refine read)


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
@pytest.mark.skipif("parallel backend: OpenMP" not in torch.__config__.parallel_info(),
                    reason="torch's intra-op threads are not OpenMP's")
def test_cpu_kernels_fork_torchs_openmp_threads():
    """at::parallel_for's `omp parallel` compiles in our sources: built without OpenMP's flag, every
    CPU kernel ran on one thread (the pragma is dropped, silently under -Wno-unknown-pragmas)."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(xkernels._LIBRARY_PATH)], capture_output=True,
                         text=True, check=True).stdout
    assert "GOMP_parallel" in out, f"{xkernels._LIBRARY_PATH} never starts an OpenMP parallel region"
    assert xkernels.build_info()["cpu_threads"] == "openmp"


def test_the_fused_cpu_read_runs_wherever_the_cpu_has_avx512():
    """The refine tests exercise the kernel this CPU runs: the fused read where AVX-512F is."""
    try:
        with open("/proc/cpuinfo") as f:
            avx512 = " avx512f" in f.read()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    assert xkernels.build_info()["cpu_read"] == ("avx512" if avx512 else "sliced")


def _on_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cpu_results_do_not_depend_on_the_thread_count(temperature, read):
    """Work splits by sequence, row or vocabulary chunk and merges in a fixed order: one thread and two
    give the same bits (the refine read hands its chunks out as threads free up), in each refine read."""

    ctx, prev, base, weights = make_case(5, 8, 7, 3000, 16, 32, seed=2)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 5, 4000, generator=g) * 3
    drafts = torch.randint(0, 4000, (6, 4), generator=g)
    q = torch.softmax(torch.randn(6, 4, 4000, generator=g), -1)
    block = torch.randint(0, 4000, (3, 10), generator=g)
    block[:, ::2] = 7
    calls = [
        lambda: xkernels.refine_step(ctx, prev, base, weights, temperature=temperature, seed=3),
        lambda: xkernels.jacobi_refine(ctx, prev[:, :2], base, weights, max_iters=3, temperature=temperature, seed=3),
        lambda: xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=temperature, seed=4),
        lambda: xkernels.dllm_step(logits[:3, :, :].repeat(1, 2, 1), block, 7, num_unmask=2,
                                   temperature=temperature, seed=5),
    ]
    for call in calls:
        one, two = _on_threads(1, call), _on_threads(2, call)
        for a, b in zip(one, two):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
