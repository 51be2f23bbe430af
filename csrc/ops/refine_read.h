// XKERNELS_REFINE_READ=auto|gemm|fused (unset or empty: auto), read at each call so that one
// process can test or time both: how a refine pass computes its read z w_read^T.
//   gemm:  a vendor GEMM (cuBLAS; MKL/oneDNN in the CPU's vocabulary slices), then an epilogue over
//          its products
//   fused: a kernel that runs the epilogue on products it computes itself, wherever one applies
//          (CUDA: read_fused_kernel, bfloat16 weights; CPU: cpu::read_stats, the greedy float32
//          read on a CPU with AVX-512F), elsewhere the GEMM
//   auto:  CUDA: fused up to kRefineFusedAutoRows rows (refine_launch.h); CPU: as fused
// Any other value raises, naming the variable.
#pragma once

namespace xkernels {

enum class RefineRead { kAuto, kGemm, kFused };

RefineRead refine_read_from_env();

// Whether the CPU's greedy float32 refine read runs fused (cpu::read_stats): the CPU has AVX-512F
// and XKERNELS_REFINE_READ is not gemm.
bool cpu_read_fused();

}  // namespace xkernels
