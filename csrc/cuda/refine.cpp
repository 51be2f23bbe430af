// refine_step, jacobi_refine and sequential_refine on CUDA: checks, allocation, the read's GEMM
// (cuBLAS through ATen, where the plan does not fuse the read) and the launches on the current stream
// (with `errors`, first param_errors_kernel's).
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "../ops/checks.h"
#include "../ops/refine_read.h"
#include "../ops/sampling_args.h"
#include "binding.h"
#include "param_errors_binding.h"
#include "refine_launch.h"

namespace xkernels {
namespace {

// One slice of the read's product on the current stream: float32 weights take cuBLAS's SGEMM
// (TF32 only if torch.backends.cuda.matmul.allow_tf32 is set), bfloat16 weights the bf16 GEMM
// with float32 output (mm's out_dtype), so the products are not rounded to bfloat16.
cudaError_t read_gemm(void* context, const cuda::ReadGemm& g, cudaStream_t) {
  const at::TensorOptions& device = *static_cast<const at::TensorOptions*>(context);
  const auto in = device.dtype(g.type == cuda::WeightType::kFloat32 ? at::kFloat : at::kBFloat16);
  // A pass makes one call a slice (refine_read_plan), each host time the GPU may wait on: b is
  // made as w_read^T's [r, len] view directly (no t() through the dispatcher).
  const auto a = at::from_blob(const_cast<void*>(g.a), {g.rows, g.r}, {g.lda, 1}, in);
  const auto b_t = at::from_blob(const_cast<void*>(g.b), {g.r, g.len}, {1, g.r}, in);
  auto out = at::from_blob(g.out, {g.rows, g.len}, device.dtype(at::kFloat));
  if (g.type == cuda::WeightType::kFloat32) {
    at::mm_out(out, a, b_t);
  } else {
    at::mm_out(out, a, b_t, at::kFloat);
  }
  return cudaGetLastError();
}

// XKERNELS_REFINE_READ (ops/refine_read.h) picks the read of every pass (RefineReadMode in
// refine_launch.h); a captured CUDA graph keeps the read it was captured with.
cuda::RefineReadMode refine_read_mode() {
  switch (refine_read_from_env()) {
    case RefineRead::kGemm:
      return cuda::RefineReadMode::kGemm;
    case RefineRead::kFused:
      return cuda::RefineReadMode::kFused;
    default:
      return cuda::RefineReadMode::kAuto;
  }
}

struct Prepared {
  cuda::RefineParams params;
  at::TensorOptions device;  // of ctx: the read's GEMM context
  cuda::ReadGemmRunner gemm() { return {read_gemm, &device}; }
  at::Tensor workspace;
  std::vector<at::Tensor> keep_alive;  // contiguous copies the params point into
  SamplingArgs sampling;               // the per-sequence tensors params.s points into
};

Prepared prepare(const at::Tensor& ctx, const at::Tensor& tokens, const char* tokens_name, bool tokens_are_prefix,
                 const at::Tensor& base_logits, const at::Tensor& emb, const at::Tensor& mix,
                 const at::Tensor& w_gate, const at::Tensor& w_up, const at::Tensor& w_down,
                 const at::Tensor& w_read, XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
                 std::string_view filter_order, const char* op) {
  check_devices(ctx, "ctx", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_refine(ctx, tokens, tokens_name, tokens_are_prefix, base_logits, emb, mix, w_gate, w_up,
                              w_down, w_read, temperature);
  TORCH_CHECK(s.b <= cuda::kRefineMaxSlots, "ctx: the CUDA kernels take blocks of at most ",
              cuda::kRefineMaxSlots, " slots, got B=", s.b);
  if (value_checks_enabled()) check_token_ids(tokens, s.v, tokens_name);
  check_errors(errors, s.n);

  Prepared out;
  out.sampling = sampling_args(s.n, ctx.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  cuda::flag_param_errors(out.sampling, errors, op);
  auto keep = [&](const at::Tensor& t) -> const void* {
    out.keep_alive.push_back(t.contiguous());
    return out.keep_alive.back().const_data_ptr();
  };
  cuda::RefineParams& p = out.params;
  p.ctx = static_cast<const float*>(keep(ctx));
  p.prefix = static_cast<const int64_t*>(keep(tokens));
  p.prefix_len = tokens.size(1);
  p.base = keep(base_logits);
  p.base_type = cuda::logits_type(base_logits);
  p.emb = keep(emb), p.mix = keep(mix), p.w_gate = keep(w_gate), p.w_up = keep(w_up);
  p.w_down = keep(w_down), p.w_read = keep(w_read);
  p.weight_type = w_read.scalar_type() == at::kFloat ? cuda::WeightType::kFloat32 : cuda::WeightType::kBFloat16;
  p.n = s.n, p.b = s.b, p.d = s.d, p.f = s.f, p.r = s.r, p.h = s.h, p.v = s.v;
  p.s = sampling_view(out.sampling);
  p.filter = out.sampling.may_sample() && out.sampling.any_filter(s.v);
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  p.num_sms = props->multiProcessorCount;
  p.cc_major = props->major;
  p.read_mode = refine_read_mode();
  // The read is one GEMM into float32 products in HBM where they take at most kRefineGemmBytes (or a
  // sixteenth of the device's memory): slices sized for L2 ran 13 GEMMs of ~22 us at N=32 on the
  // H200 where one GEMM of the whole read took 77 us (issue 41, the run of 2026-12-04).
  p.slice_bytes = std::min<int64_t>(cuda::kRefineGemmBytes, static_cast<int64_t>(props->totalGlobalMem / 16));
  out.device = ctx.options();
  out.workspace = cuda::workspace(cuda::refine_workspace_bytes(p), ctx);
  return out;
}

std::tuple<at::Tensor, at::Tensor> refine_step_cuda(const at::Tensor& ctx, const at::Tensor& prev_tokens,
                                                    const at::Tensor& base_logits, XK_REFINE_WEIGHT_ARGS,
                                                    XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
                                                    std::string_view filter_order) {
  const c10::cuda::CUDAGuard guard(ctx.device());
  auto prep = prepare(ctx, prev_tokens, "prev_tokens", false, base_logits, emb, mix, w_gate, w_up, w_down, w_read,
                      XK_SAMPLING_FORWARD, errors, filter_order, "refine_step");
  const auto& p = prep.params;
  auto tokens = at::empty({p.n, p.d}, prev_tokens.options());
  auto logprobs = at::empty({p.n, p.d}, ctx.options());
  cuda::check_launch(cuda::launch_refine_step(p, prep.gemm(), prep.workspace.mutable_data_ptr(), tokens.mutable_data_ptr<int64_t>(),
                                        logprobs.mutable_data_ptr<float>(), cuda::stream()),
               "refine_step");
  return {tokens, logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> jacobi_refine_cuda(const at::Tensor& ctx,
                                                                  const at::Tensor& prefix_tokens,
                                                                  const at::Tensor& base_logits,
                                                                  XK_REFINE_WEIGHT_ARGS, int64_t max_iters,
                                                                  XK_SAMPLING_ARGS,
                                                                  const std::optional<at::Tensor>& errors,
                                                                  std::string_view filter_order) {
  TORCH_CHECK(max_iters >= 0, "max_iters must be >= 0, got ", max_iters);
  const c10::cuda::CUDAGuard guard(ctx.device());
  auto prep = prepare(ctx, prefix_tokens, "prefix_tokens", true, base_logits, emb, mix, w_gate, w_up, w_down, w_read,
                      XK_SAMPLING_FORWARD, errors, filter_order, "jacobi_refine");
  const auto& p = prep.params;
  auto tokens = at::empty({p.n, p.d}, prefix_tokens.options());
  auto logprobs = at::empty({p.n, p.d}, ctx.options());
  auto iters = at::zeros({p.n}, prefix_tokens.options().dtype(at::kInt));
  cuda::check_launch(cuda::launch_jacobi_refine(p, prep.gemm(), max_iters, prep.workspace.mutable_data_ptr(),
                                          tokens.mutable_data_ptr<int64_t>(), logprobs.mutable_data_ptr<float>(),
                                          iters.mutable_data_ptr<int32_t>(), cuda::stream()),
               "jacobi_refine");
  return {tokens, logprobs, iters};
}

std::tuple<at::Tensor, at::Tensor> sequential_refine_cuda(const at::Tensor& ctx, const at::Tensor& prefix_tokens,
                                                          const at::Tensor& base_logits, XK_REFINE_WEIGHT_ARGS,
                                                          XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
                                                          std::string_view filter_order) {
  const c10::cuda::CUDAGuard guard(ctx.device());
  auto prep = prepare(ctx, prefix_tokens, "prefix_tokens", true, base_logits, emb, mix, w_gate, w_up, w_down, w_read,
                      XK_SAMPLING_FORWARD, errors, filter_order, "sequential_refine");
  const auto& p = prep.params;
  auto tokens = at::zeros({p.n, p.d}, prefix_tokens.options());
  auto logprobs = at::empty({p.n, p.d}, ctx.options());
  cuda::check_launch(cuda::launch_sequential_refine(p, prep.gemm(), prep.workspace.mutable_data_ptr(), tokens.mutable_data_ptr<int64_t>(),
                                              logprobs.mutable_data_ptr<float>(),
                                              cuda::stream()),
               "sequential_refine");
  return {tokens, logprobs};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CUDA, m) {
  m.impl("refine_step", &refine_step_cuda);
  m.impl("jacobi_refine", &jacobi_refine_cuda);
  m.impl("sequential_refine", &sequential_refine_cuda);
}

}  // namespace xkernels
