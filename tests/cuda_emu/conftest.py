import os

import pytest

from tests.cuda_emu.emu import CudaEmu


def pytest_collection_modifyitems(config, items):
    # The coverage test reads what the others ran: it goes last.
    items.sort(key=lambda item: "test_kernel_coverage" in str(item.fspath))
    if os.environ.get("XK_CUDA_EMU_LIB"):
        return
    skip = pytest.mark.skip(reason="the CUDA emulation runs through tests/cuda_emu/run.sh")
    for item in items:
        if "cuda_emu" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def emu():
    return CudaEmu()
