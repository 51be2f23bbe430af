// Philox4x32-10 counter-based RNG (Salmon et al., SC'11), shared by the CPU and
// CUDA kernels so that the same (seed, offset) gives the same stream on both.
//
// How the package keys it:
//   key     = (seed_lo, seed_hi ^ offset_hi)
//   counter = (draw, position, sequence, offset_lo)
// `sequence` is the batch row, `position` the slot or verification row inside
// it, and `draw` indexes the words of that (sequence, position) stream: the
// noise of vocabulary id v is word v % 4 of draw v / 4; draw 0xFFFFFFFF is
// reserved for a per-position acceptance coin. Advancing `offset` by one gives
// a fresh, independent stream for every (sequence, position).
#pragma once

#include <cstdint>

#include "xkernels/host_device.h"

namespace xkernels {

struct Philox4 {
  uint32_t w[4];
};

// The draw index of the acceptance coin; vocabulary draws stay below 2^29.
constexpr uint32_t kCoinDraw = 0xFFFFFFFFu;

// A 32 x 32 -> 64-bit product in halves, for one lane; the CPU kernels pass their own for vectors.
struct MulHiLo32 {
  XK_HD void operator()(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) const {
    const uint64_t p = static_cast<uint64_t>(a) * b;
    hi = static_cast<uint32_t>(p >> 32);
    lo = static_cast<uint32_t>(p);
  }
};

// The ten rounds on counters c[4] of any lane type U (uint32_t, or a CPU vector of them, which
// computes several counters at once) given its mulhilo.
template <typename U, typename MulHiLo>
XK_HD void philox_rounds(U c[4], uint32_t k0, uint32_t k1, MulHiLo mulhilo) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    U hi0, lo0, hi1, lo1;
    mulhilo(c[0], kMul0, hi0, lo0);
    mulhilo(c[2], kMul1, hi1, lo1);
    c[0] = hi1 ^ c[1] ^ k0;
    c[1] = lo1;
    c[2] = hi0 ^ c[3] ^ k1;
    c[3] = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
}

XK_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                            uint32_t k0, uint32_t k1) {
  uint32_t c[4] = {c0, c1, c2, c3};
  philox_rounds(c, k0, k1, MulHiLo32{});
  return Philox4{{c[0], c[1], c[2], c[3]}};
}

XK_HD Philox4 philox_draw(uint64_t seed, uint64_t offset, uint32_t sequence,
                          uint32_t position, uint32_t draw) {
  return philox4x32_10(draw, position, sequence, static_cast<uint32_t>(offset),
                       static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ static_cast<uint32_t>(offset >> 32));
}

// A uniform strictly inside (0, 1): the top 23 bits, centred in their bucket,
// so every value is exact in float32 and 2^-24 <= u <= 1 - 2^-24.
XK_HD float uniform_open(uint32_t word) {
  return (static_cast<float>(word >> 9) + 0.5f) * 1.1920928955078125e-07f;  // 2^-23
}

}  // namespace xkernels
