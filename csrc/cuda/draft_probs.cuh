// Draft probabilities q as the chain verify kernels read them: float32, bfloat16 or float16 (an
// EAGLE drafter's q is bfloat16), each value converted to float on load. The conversion is exact,
// so the results are those of the same values given as float32, and no float32 copy of q is made.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "device_utils.cuh"
#include "launch_types.h"

namespace xkernels::cuda {

// A pointer into q, of q's element type (LogitsType: the same three), read as floats; null where
// the op has no draft probabilities. Indexing and offsets count elements, as a float pointer's do.
struct ProbsPtr {
  const void* p = nullptr;
  LogitsType dtype = LogitsType::kFloat32;

  __host__ __device__ explicit operator bool() const { return p != nullptr; }

  __device__ __forceinline__ float operator[](int64_t i) const {
    switch (dtype) {  // uniform across the launch: the branch never diverges
      case LogitsType::kBFloat16: return to_float(static_cast<const __nv_bfloat16*>(p)[i]);
      case LogitsType::kFloat16: return to_float(static_cast<const __half*>(p)[i]);
      default: return static_cast<const float*>(p)[i];
    }
  }

  __host__ __device__ ProbsPtr operator+(int64_t i) const {
    if (p == nullptr) return *this;
    const int64_t size = dtype == LogitsType::kFloat32 ? 4 : 2;
    return ProbsPtr{static_cast<const char*>(p) + i * size, dtype};
  }
};

}  // namespace xkernels::cuda
