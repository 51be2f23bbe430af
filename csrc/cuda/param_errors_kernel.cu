// The asynchronous error flag of every op whose kernels do not set it (all but
// chain_verify_ragged_): a thread a row ORs the row's bits into its word. The bits depend on the
// [N] parameter tensors only, so one small launch serves every op, and the ops' large kernels
// (their registers, their shared memory) stay as they are; it runs only when the caller passes an
// errors buffer.
#include "device_utils.cuh"
#include "param_errors_launch.h"
#include "xkernels/param_errors.h"

namespace xkernels::cuda {
namespace {

__global__ void __launch_bounds__(kThreads) param_errors_kernel(SamplingView s, int64_t n, int32_t* errors) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (row < n) errors[row] |= row_param_errors(s, row);  // this thread is the word's only writer
}

}  // namespace

cudaError_t launch_param_errors(const SamplingView& s, int64_t n, int32_t* errors, cudaStream_t stream) {
  if (n == 0 || !(s.temperature || s.top_k || s.top_p || s.min_p)) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;  // below the grid's 2^31 - 1 for any n under 2^39
  param_errors_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(s, n, errors);
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
