"""The emulation itself: it runs correct CUDA code and reports each rule a kernel breaks."""
import ctypes
import os
import subprocess
import sys

import pytest


def run_case(emu, which):
    msg = ctypes.create_string_buffer(1024)
    result = ctypes.c_float()
    rc = emu.lib.xk_emu_selftest(ctypes.c_int(which), ctypes.byref(result), msg, ctypes.c_size_t(len(msg)))
    return rc, msg.value.decode(), result.value


def test_correct_kernel_runs(emu):
    rc, msg, result = run_case(emu, 0)
    assert (rc, msg) == (0, "")
    assert result == sum(range(64))


@pytest.mark.parametrize("which,expected", [
    (1, "exited"),
    (2, "exited"),
    (3, "leaves out the calling lane"),
    (4, "meets"),
    (5, "__syncthreads"),
    (6, "not in mask"),
    (7, "without the opt-in"),
    (9, "empty grid"),
    (10, "block of 2048 threads"),
    (13, "exited while other threads of its cluster wait at cluster.sync"),
    (14, "reached __syncthreads while thread (0,0,0) of block (0,0,0) waits at cluster.sync"),
    (15, "reached cluster.sync while thread (0,0,0) of block (1,0,0) waits for it at __shfl_xor_sync"),
    (16, "grid (3,1,1) not a multiple of the cluster (2,1,1)"),
    (17, "more than 8 blocks without the non-portable opt-in"),
    (19, "of more than 16 blocks"),
    (20, "empty cluster"),
    (22, "not aligned to its 16 bytes"),
    (23, "outside the block's shared memory"),
])
def test_violation_is_reported(emu, which, expected):
    rc, msg, _ = run_case(emu, which)
    assert rc == -1 and expected in msg, msg


def test_cluster_blocks_run_together_with_their_own_shared_memory(emu):
    """cluster_exchange: each block reads the other block's value after cluster.sync (blocks run one
    after another would deadlock there) and its own static shared value (a copy a block)."""
    rc, msg, result = run_case(emu, 12)
    assert (rc, msg) == (0, "")
    assert result == 21 + 12 + 43 + 34


def test_opt_in_allows_a_cluster_of_16_blocks(emu):
    rc, msg, result = run_case(emu, 18)
    assert (rc, msg) == (0, "")
    assert result == 16


def test_async_copies_land_at_the_wait_for_their_group(emu):
    """async_copy_groups: after a wait for all but the newest group, the older group's copy is in
    shared memory and the newer one's destination still holds the value written before it."""
    rc, msg, result = run_case(emu, 21)
    assert (rc, msg) == (0, "")
    assert result == sum(range(8))


def test_opt_in_allows_big_dynamic_shared_memory(emu):
    assert run_case(emu, 8)[:2] == (0, "")


def test_out_of_bounds_read_is_caught():
    code = ("import ctypes, os; lib = ctypes.CDLL(os.environ['XK_CUDA_EMU_LIB']); "
            "lib.xk_emu_selftest(11, None, ctypes.create_string_buffer(8), 8)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert proc.returncode != 0
    assert "heap-buffer-overflow" in proc.stderr
