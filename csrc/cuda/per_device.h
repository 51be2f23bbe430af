// What a launcher asks of the CUDA runtime once a device and then reuses (a kernel's shared-memory
// opt-in, an occupancy): each such host call costs microseconds a launch, and a value kept from the
// first, eager call keeps them out of every later launch, those inside a CUDA-graph capture included.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <climits>

namespace xkernels::cuda {

class PerDevice {
 public:
  struct Result {
    int value;
    bool keep;  // false: asked again next time (a failed query's fallback)
  };

  PerDevice() {
    for (auto& v : values_) v.store(kUnknown, std::memory_order_relaxed);
  }

  // The value of the current device: compute() -> Result the first time, the kept value after.
  // Threads that race on the first call each compute the same value.
  template <typename F>
  int get(F&& compute) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) {
      (void)cudaGetLastError();  // a failed query is no launch error
      return compute().value;
    }
    int v = values_[device].load(std::memory_order_acquire);
    if (v == kUnknown) {
      const Result r = compute();
      v = r.value;
      if (r.keep) values_[device].store(v, std::memory_order_release);
    }
    return v;
  }

 private:
  static constexpr int kMaxDevices = 64;
  static constexpr int kUnknown = INT_MIN;
  std::atomic<int> values_[kMaxDevices];
};

// Opts `kernel` into the most dynamic shared memory the current device lets a block have (its
// opt-in limit less the kernel's static shared memory), once a device (`done`: one per kernel).
// Launches of any size up to that limit then need no call (above 48 KB a kernel must opt in).
template <typename... P>
cudaError_t opt_in_max_dynamic_smem(PerDevice& done, void (*kernel)(P...)) {
  return static_cast<cudaError_t>(done.get([&] {
    int device = 0, limit = 0;
    cudaFuncAttributes attr{};
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess) err = cudaFuncGetAttributes(&attr, kernel);
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 limit - static_cast<int>(attr.sharedSizeBytes));
    return PerDevice::Result{static_cast<int>(err), err == cudaSuccess};
  }));
}

}  // namespace xkernels::cuda
