// A test-only emulation of the CUDA execution model on the CPU, so that the real .cu sources
// run (under AddressSanitizer and UndefinedBehaviorSanitizer) on a machine without a GPU.
//
// Every CUDA thread of a block is a fiber; the blocks of a thread block cluster run together (all
// their fibers), clusters (a block each without a cluster launch) one after another. Barriers,
// cluster barriers and warp collectives are checked rendezvous: a lane that is missing (exited, or
// waiting at a different collective or mask or barrier), a mask that leaves out the calling lane or
// names lanes the block does not have, and a shuffle that reads a lane outside its mask are
// violations. So are launches CUDA would refuse (empty grid, block over 1024 threads, dynamic shared
// memory above 48 KB without the opt-in, a grid not a multiple of the cluster, a cluster over 8
// blocks without the opt-in). A violation stops the kernel; launches then fail like CUDA's
// (cudaGetLastError), and xk_emu::take_violation() tells the test what happened.
//
// What it cannot see: races on shared or global memory between barriers (threads interleave only
// at barriers and collectives), the memory model, and GPU rounding (host libm, no FMA contraction
// rules of nvcc). See README.md.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- keywords -----------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
// No __shared__: translate.py rewrites static shared memory to xk_emu::block_shared (a copy a
// running block) and dynamic shared memory to xk_emu::dynamic_smem.
#define __align__(n) __attribute__((aligned(n)))

// ---- runtime types ------------------------------------------------------------------------
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;

struct CUstream_st;
using cudaStream_t = CUstream_st*;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
  cudaErrorInvalidClusterSize = 912,
};
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributeNonPortableClusterSizeAllowed = 14,
};

struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };

namespace xk_emu {

struct Coords {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
};
const Coords& coords();  // of the running fiber

// Rendezvous of the lanes of `mask` in the caller's warp. `value` is this lane's 8-byte input;
// returns this lane's result. Kinds: see cuda_emu.cpp.
enum class Op { kShflIdx, kShflXor, kShflDown, kShflUp, kBallot, kAny, kAll, kReduceMax, kSyncWarp, kWmma };
uint64_t warp_collective(Op op, unsigned mask, uint64_t value, int arg, int width);
void block_barrier();

cudaError_t launch_check(const void* kernel, dim3 grid, dim3 block, size_t smem, dim3 cluster = dim3());
void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, void (*body)(void*), void* arg,
              dim3 cluster = dim3());
// The running block's copy of the static shared variable declared at `site` (translate.py), `bytes`
// of garbage at the block's first use.
void* block_shared_bytes(const void* site, size_t bytes);
// The cluster of the running thread (a block, outside a cluster launch): cooperative_groups.
void cluster_barrier();
unsigned cluster_block_rank();
dim3 cluster_dims();
// The names of the kernels that have run a block, comma-separated (for the coverage test).
std::string launched_kernels();
void* dynamic_smem_base();
// The running thread's asynchronous copies into shared memory (cuda_pipeline_primitives.h): the
// source is read at the copy, the destination written only when a wait covers its group, so a read
// of the destination before that wait finds what was there before (garbage), as it may on a GPU.
void async_copy(void* dst, const void* src, size_t bytes, size_t zfill);
void async_commit();
void async_wait_prior(size_t prior);
cudaError_t take_last_error(bool clear);
void set_max_dynamic_smem(const void* kernel, int bytes);
void set_non_portable_cluster_size(const void* kernel, bool allowed);

// Tests read (and clear) the first violation of the emulated CUDA rules since the last call;
// empty if none.
std::string take_violation();

// The passes over a row the kernels started (row_filter.cuh's XK_ROW_PASS, counted once a block)
// since the last call, which clears them: the tests of the pass counts bench/floors.md states.
void count_row_pass();
uint64_t take_row_passes();
// The grids launched in clusters of more than one block since the last call, which clears them.
uint64_t take_cluster_launches();

template <typename T>
T* dynamic_smem() {
  return static_cast<T*>(dynamic_smem_base());
}

template <typename T>
T& block_shared(const void* site) {
  static_assert(std::is_trivially_copyable_v<T>, "shared memory holds no constructed objects");
  return *static_cast<T*>(block_shared_bytes(site, sizeof(T)));
}

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}

template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

// kernel<<<grid, block, smem, stream>>>(args) becomes xk_emu::launch("kernel", kernel, grid, block, smem, stream)(args).
template <typename... P>
struct Launch {
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;

  dim3 cluster = dim3();

  template <typename... A>
  cudaError_t operator()(A&&... a) const {
    const cudaError_t err = launch_check(reinterpret_cast<const void*>(kernel), grid, block, smem, cluster);
    if (err != cudaSuccess) return err;
    struct Bound {
      void (*kernel)(P...);
      std::tuple<std::decay_t<P>...> args;
    } bound{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(a)...)};
    run_grid(name, grid, block, smem, [](void* b) {
      auto* self = static_cast<Bound*>(b);
      std::apply(self->kernel, self->args);  // by value: each thread gets its own copy of the arguments
    }, &bound, cluster);
    return cudaSuccess;
  }
};

inline dim3 to_dim3(dim3 d) { return d; }
// A grid or block given as an integer: CUDA converts it to unsigned; so does this, and the
// launch check then sees what CUDA would.
template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
dim3 to_dim3(I n) {
  return dim3(n < 0 || static_cast<uint64_t>(n) > 0xFFFFFFFFull ? 0u : static_cast<unsigned>(n));
}

template <typename... P, typename G, typename B>
Launch<P...> launch(const char* name, void (*kernel)(P...), G grid, B block, size_t smem = 0,
                    cudaStream_t = nullptr) {
  return Launch<P...>{name, kernel, to_dim3(grid), to_dim3(block), smem};
}

}  // namespace xk_emu

#define threadIdx (::xk_emu::coords().thread_idx)
#define blockIdx (::xk_emu::coords().block_idx)
#define blockDim (::xk_emu::coords().block_dim)
#define gridDim (::xk_emu::coords().grid_dim)
constexpr int warpSize = 32;

// cudaLaunchKernelEx and the launch attribute it takes here: the cluster's shape.
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4 };
union cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
  char pad[64];
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 grid_dim, block_dim;  // gridDim, blockDim: translate.py renames them (gridDim is a macro here)
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

namespace xk_emu {
// cudaLaunchKernelEx(config, kernel, args) becomes launch_ex("kernel", config, kernel, args)
// (translate.py). The launch's error is returned, and is the last error, as CUDA's.
template <typename... P, typename... A>
cudaError_t launch_ex(const char* name, const cudaLaunchConfig_t* config, void (*kernel)(P...), A&&... args) {
  dim3 cluster;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) {
      const auto& c = config->attrs[i].val.clusterDim;
      cluster = dim3(c.x, c.y, c.z);
    }
  const Launch<P...> launch{name, kernel, config->grid_dim, config->block_dim, config->dynamicSmemBytes, cluster};
  return launch(std::forward<A>(args)...);
}
}  // namespace xk_emu

// What the launchers ask of a kernel's binary: an emulated kernel is built for every architecture;
// its static shared memory is not known before it runs (0).
struct cudaFuncAttributes {
  int binaryVersion, ptxVersion;
  size_t sharedSizeBytes;
};
template <typename... P>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, void (*)(P...)) {
  *attr = cudaFuncAttributes{90, 90, 0};
  return cudaSuccess;
}

// The emulated device (device 0, the only one): an H100/H200's 132 SMs and 227 KB of shared memory
// a block may opt into. The emulation knows no registers: an SM holds as many blocks of a kernel as
// its 2048 threads, 32 blocks and 228 KB of shared memory allow, and a cluster launch one block an
// SM (spiffy_accept's occupancy at 142-153 registers), so kDeviceSms / size clusters at once.
namespace xk_emu {
constexpr int kDeviceSms = 132;
constexpr int kDeviceSmemOptin = 227 * 1024;
}  // namespace xk_emu
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return cudaErrorInvalidValue;
  *value = attr == cudaDevAttrMultiProcessorCount ? xk_emu::kDeviceSms : xk_emu::kDeviceSmemOptin;
  return cudaSuccess;
}
template <typename... P>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void (*)(P...), int block_size, size_t smem) {
  if (block_size < 1 || block_size > 1024) return cudaErrorInvalidValue;
  int fit = 2048 / block_size < 32 ? 2048 / block_size : 32;
  if (smem > 0 && static_cast<size_t>(228 * 1024) / smem < static_cast<size_t>(fit))
    fit = static_cast<int>(static_cast<size_t>(228 * 1024) / smem);
  *blocks = fit;
  return cudaSuccess;
}
template <typename... P>
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, void (*)(P...), const cudaLaunchConfig_t* config) {
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == cudaLaunchAttributeClusterDimension) {
      const auto& c = config->attrs[i].val.clusterDim;
      const unsigned size = c.x * c.y * c.z;
      if (size == 0 || size > 8) return cudaErrorInvalidClusterSize;
      *clusters = xk_emu::kDeviceSms / static_cast<int>(size);
      return cudaSuccess;
    }
  *clusters = xk_emu::kDeviceSms;
  return cudaSuccess;
}

inline cudaError_t cudaGetLastError() { return xk_emu::take_last_error(true); }
inline cudaError_t cudaPeekAtLastError() { return xk_emu::take_last_error(false); }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidClusterSize: return "invalid cluster size";
    default: return "unspecified launch failure";
  }
}
template <typename... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > xk_emu::kDeviceSmemOptin) return cudaErrorInvalidValue;
    xk_emu::set_max_dynamic_smem(reinterpret_cast<const void*>(kernel), value);
  }
  if (attr == cudaFuncAttributeNonPortableClusterSizeAllowed)
    xk_emu::set_non_portable_cluster_size(reinterpret_cast<const void*>(kernel), value != 0);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}

// ---- synchronisation and warp intrinsics --------------------------------------------------
inline void __syncthreads() { xk_emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  xk_emu::warp_collective(xk_emu::Op::kSyncWarp, mask, 0, 0, 32);
}

template <typename T>
T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return xk_emu::from_bits<T>(xk_emu::warp_collective(xk_emu::Op::kShflIdx, mask, xk_emu::to_bits(v), src, width));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return xk_emu::from_bits<T>(
      xk_emu::warp_collective(xk_emu::Op::kShflXor, mask, xk_emu::to_bits(v), lane_mask, width));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return xk_emu::from_bits<T>(
      xk_emu::warp_collective(xk_emu::Op::kShflDown, mask, xk_emu::to_bits(v), static_cast<int>(delta), width));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return xk_emu::from_bits<T>(
      xk_emu::warp_collective(xk_emu::Op::kShflUp, mask, xk_emu::to_bits(v), static_cast<int>(delta), width));
}
inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(xk_emu::warp_collective(xk_emu::Op::kBallot, mask, pred != 0, 0, 32));
}
inline int __any_sync(unsigned mask, int pred) {
  return static_cast<int>(xk_emu::warp_collective(xk_emu::Op::kAny, mask, pred != 0, 0, 32));
}
inline int __all_sync(unsigned mask, int pred) {
  return static_cast<int>(xk_emu::warp_collective(xk_emu::Op::kAll, mask, pred != 0, 0, 32));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned value) {
  return static_cast<unsigned>(xk_emu::warp_collective(xk_emu::Op::kReduceMax, mask, value, 0, 32));
}

// ---- atomics (fibers never interleave inside one) -------------------------------------------
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <typename T>
T atomicOr(T* p, T v) {
  const T old = *p;
  *p = old | v;
  return old;
}

// ---- integer and float intrinsics ----------------------------------------------------------
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline unsigned __float_as_uint(float x) { return xk_emu::from_bits<unsigned>(xk_emu::to_bits(x)); }
inline float __uint_as_float(unsigned x) { return xk_emu::from_bits<float>(x); }
inline int __float_as_int(float x) { return xk_emu::from_bits<int>(xk_emu::to_bits(x)); }
inline float __int_as_float(int x) { return xk_emu::from_bits<float>(static_cast<uint32_t>(x)); }
template <typename T>
T __ldg(const T* p) {
  return *p;
}
template <typename T>
T __ldcs(const T* p) {  // a streaming (evict-first) load: a plain one here
  return *p;
}
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32);
}

// ---- 16-bit floats --------------------------------------------------------------------------
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

inline float __bfloat162float(__nv_bfloat16 x) { return __uint_as_float(static_cast<unsigned>(x.bits) << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN kept quiet
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return __nv_bfloat16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  return __nv_bfloat16{static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
inline float __half2float(__half x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline __half __float2half(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  __half out;
  std::memcpy(&out.bits, &h, 2);
  return out;
}

#define XK_ROW_PASS() ::xk_emu::count_row_pass()
