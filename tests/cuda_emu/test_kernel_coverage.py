"""Every __global__ of csrc/cuda ran under the emulation in this session. The other test files of
this folder run first (conftest.py orders this one last); run the whole folder."""
import ctypes
import re
from pathlib import Path

# Every kernel of the package, by the file that defines it; the test below checks this list
# against the sources, so a new kernel must be added here (and covered) the day it lands.
KERNELS = {
    "chain_ragged_kernel.cu": {"chain_ragged_scan_kernel", "chain_ragged_stats_kernel", "chain_ragged_select_kernel",
                               "chain_ragged_rows_kernel", "chain_ragged_residual_kernel", "chain_ragged_kernel"},
    "chain_verify_kernel.cu": {"row_stats_kernel", "chain_walk_kernel", "sample_slices_kernel",
                               "sample_finish_kernel"},
    "refine_kernel.cu": {"front_mix_kernel", "front_hidden_kernel", "front_down_kernel", "read_epilogue_kernel",
                         "merge_kernel", "jacobi_init_kernel", "jacobi_update_kernel"},
    "refine_read_fused_kernel.cu": {"read_fused_kernel"},
    "refine_filtered_pick_kernel.cu": {"filtered_scan_kernel", "min_p_slices_kernel", "filtered_select_kernel",
                                       "filtered_pick_kernel"},
    "tree_kernel.cu": {"build_tree_kernel", "tree_mask_kernel", "tree_sample_kernel", "tree_sample_finish_kernel",
                       "compact_kv_kernel"},
    "tree_walk.cuh": {"tree_verify_kernel"},
    "dllm_kernel.cu": {"dllm_slices_kernel", "dllm_merge_kernel", "dllm_select_kernel"},
    "dllm_filtered.cuh": {"dllm_scan_kernel", "dllm_pick_kernel", "dllm_filtered_kernel"},
    "spiffy_materialize_kernel.cu": {"spiffy_rows_kernel", "spiffy_select_kernel", "spiffy_materialize_kernel"},
    "spiffy_filtered_rows.cuh": {"spiffy_scan_kernel", "spiffy_filtered_rows_kernel"},
    "spiffy_kernels.cuh": {"spiffy_accept_prepare_kernel", "spiffy_accept_kernel"},
    "spiffy_filtered.cuh": {"spiffy_accept_scan_kernel", "spiffy_accept_pick_kernel"},
    "spiffy_mask_kernel.cu": {"spiffy_mask_kernel"},
    "param_errors_kernel.cu": {"param_errors_kernel"},
    "shard_row_stats_kernel.cu": {"shard_row_stats_kernel"},
    "shard_cut_kernel.cu": {"shard_cut_histogram_kernel", "shard_cut_pick_kernel", "shard_cut_candidates_kernel",
                            "shard_cut_candidates_one_pass_kernel"},
}
CUDA = Path(__file__).resolve().parents[2] / "csrc" / "cuda"


def test_the_list_names_every_kernel_of_the_sources():
    found = {}
    for path in sorted([*CUDA.glob("*.cu"), *CUDA.glob("*.cuh")]):  # a kernel template may live in a header
        names = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)", path.read_text()))
        if names:
            found[path.name] = names
    assert found == KERNELS


def test_every_kernel_ran(emu):
    buffer = ctypes.create_string_buffer(4096)
    emu.lib.xk_emu_launched_kernels(buffer, ctypes.c_size_t(len(buffer)))
    ran = set(buffer.value.decode().split(","))
    missing = set().union(*KERNELS.values()) - ran
    assert not missing, f"kernels the emulation never ran: {sorted(missing)}"
