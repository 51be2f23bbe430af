// Stand-in for CUDA's <mma.h>: the warp matrix functions (nvcuda::wmma) for 16x16x16 tiles.
// Each lane keeps the whole tile (the real per-lane layout is unspecified, so kernels cannot
// depend on it); every call is a checked full-warp rendezvous, and pointers and leading
// dimensions are checked against the documented requirements (256-bit alignment, ldm a
// multiple of 16 bytes).
#pragma once
#include <cstdint>
#include <string>

#include "../cuda_emu.h"

namespace xk_emu {
void report(const std::string& what);
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16x16x16 shape only");
  static constexpr int num_elements = 256;
  float x[256];  // [row][col] of the tile (A: M x K, B: K x N, C: M x N)
};

namespace detail {
template <typename T>
float to_f(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else return static_cast<float>(v);
}
inline void rendezvous(const void* ptr, unsigned ldm, size_t elem) {
  xk_emu::warp_collective(xk_emu::Op::kWmma, 0xFFFFFFFFu, 0, 0, 32);
  if (ptr && reinterpret_cast<uintptr_t>(ptr) % 32 != 0) xk_emu::report("wmma: pointer not 256-bit aligned");
  if (ptr && (ldm * elem) % 16 != 0) xk_emu::report("wmma: ldm is not a multiple of 16 bytes");
}
template <bool kRowMajor, typename T>
void load(float* x, const T* p, unsigned ldm) {
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) x[i * 16 + j] = to_f(kRowMajor ? p[i * ldm + j] : p[j * ldm + i]);
}
}  // namespace detail

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  detail::rendezvous(p, ldm, sizeof(T));
  detail::load<std::is_same_v<Layout, row_major>>(f.x, p, ldm);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p, unsigned ldm,
                             layout_t layout) {
  detail::rendezvous(p, ldm, sizeof(float));
  if (layout == mem_row_major) detail::load<true>(f.x, p, ldm);
  else detail::load<false>(f.x, p, ldm);
}

template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, T v) {
  detail::rendezvous(nullptr, 0, 1);
  for (float& e : f.x) e = static_cast<float>(v);
}

template <typename TA, typename LA, typename TB, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
  detail::rendezvous(nullptr, 0, 1);
  float out[256];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float acc = c.x[i * 16 + j];
      for (int k = 0; k < 16; ++k) acc += a.x[i * 16 + k] * b.x[k * 16 + j];
      out[i * 16 + j] = acc;
    }
  for (int i = 0; i < 256; ++i) d.x[i] = out[i];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                              layout_t layout) {
  detail::rendezvous(p, ldm, sizeof(float));
  if (::xk_emu::coords().thread_idx.x % 32 != 0) return;  // every lane holds the same tile: one writes it
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) (layout == mem_row_major ? p[i * ldm + j] : p[j * ldm + i]) = f.x[i * 16 + j];
}

}  // namespace nvcuda::wmma
