import shutil
import subprocess

import pytest
import torch

import xkernels


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
@pytest.mark.skipif("parallel backend: OpenMP" not in torch.__config__.parallel_info(),
                    reason="torch's intra-op threads are not OpenMP's")
def test_cpu_kernels_fork_torchs_openmp_threads():
    """at::parallel_for's `omp parallel` compiles in our sources: built without OpenMP's flag, every
    CPU kernel ran on one thread (the pragma is dropped, silently under -Wno-unknown-pragmas)."""
    out = subprocess.run(["nm", "-D", "--undefined-only", str(xkernels._LIBRARY_PATH)], capture_output=True,
                         text=True, check=True).stdout
    assert "GOMP_parallel" in out, f"{xkernels._LIBRARY_PATH} never starts an OpenMP parallel region"
