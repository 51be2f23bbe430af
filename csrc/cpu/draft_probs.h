// Draft probabilities q as the CPU verify kernels read them: float32, bfloat16 or float16, each
// value converted to float on load (exact), so a bfloat16 q gives the results of the same values
// in float32 without a float32 copy of q.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace xkernels::cpu {

// Rows of v values of a contiguous q (or none: a null view).
class DraftProbs {
 public:
  DraftProbs() = default;
  DraftProbs(const at::Tensor& q, int64_t v)
      : data_(q.defined() ? q.const_data_ptr() : nullptr), dtype_(q.defined() ? q.scalar_type() : at::kFloat), v_(v) {}

  explicit operator bool() const { return data_ != nullptr; }

  // The view from row r on.
  DraftProbs rows_from(int64_t r) const {
    DraftProbs d = *this;
    if (data_) d.data_ = static_cast<const char*>(data_) + r * v_ * static_cast<int64_t>(c10::elementSize(dtype_));
    return d;
  }

  // q[r, x].
  float at(int64_t r, int64_t x) const {
    const int64_t i = r * v_ + x;
    switch (dtype_) {
      case at::kBFloat16: return static_cast<const c10::BFloat16*>(data_)[i];
      case at::kHalf: return static_cast<const c10::Half*>(data_)[i];
      default: return static_cast<const float*>(data_)[i];
    }
  }

  // Row r as floats, for the vectorised row functions: in place for float32, else converted into
  // `scratch` (v floats).
  const float* row(int64_t r, float* scratch) const {
    switch (dtype_) {
      case at::kBFloat16: return convert(static_cast<const c10::BFloat16*>(data_) + r * v_, scratch);
      case at::kHalf: return convert(static_cast<const c10::Half*>(data_) + r * v_, scratch);
      default: return static_cast<const float*>(data_) + r * v_;
    }
  }

  // Whether row() needs scratch.
  bool converts() const { return data_ != nullptr && dtype_ != at::kFloat; }

 private:
  template <typename Q>
  const float* convert(const Q* q, float* out) const {
    for (int64_t x = 0; x < v_; ++x) out[x] = static_cast<float>(q[x]);
    return out;
  }

  const void* data_ = nullptr;
  at::ScalarType dtype_ = at::kFloat;
  int64_t v_ = 0;
};

}  // namespace xkernels::cpu
