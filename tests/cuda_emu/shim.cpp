// C entry points over the real CUDA launchers (csrc/cuda/*_launch.h) for ctypes. Every input
// is copied into a "device" buffer of exactly its size, aligned like cudaMalloc's (AddressSanitizer then flags any read or
// write past it), outputs start as 0xA5 garbage unless the launcher's contract says the caller
// zero-fills them, and what the kernels wrote is copied back.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "chain_ragged_launch.h"
#include "chain_verify_launch.h"
#include "dllm_launch.h"
#include "cuda_emu.h"
#include "param_errors_launch.h"
#include "refine_launch.h"
#include "row_cut_launch.h"
#include "shard_cut_launch.h"
#include "shard_row_stats_launch.h"
#include "spiffy_launch.h"
#include "tree_launch.h"
#include "xkernels/sampling.h"

namespace {

class Device {
 public:
  ~Device() {
    for (void* p : owned_) std::free(p);
  }
  template <typename T = void>
  T* alloc(size_t bytes, int fill) {
    void* p = nullptr;  // 256-byte aligned like cudaMalloc; exactly `bytes` addressable
    if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) std::abort();
    std::memset(p, fill, bytes);
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  const T* copy(const T* host, size_t bytes) {
    if (!host) return nullptr;
    T* d = alloc<T>(bytes, 0);
    std::memcpy(d, host, bytes);
    return d;
  }

 private:
  std::vector<void*> owned_;
};

// The launch's result: its cudaError_t, or -1 with the emulation's violation in `message`.
int finish(cudaError_t err, char* message, size_t message_len) {
  const std::string v = xk_emu::take_violation();
  const cudaError_t pending = cudaGetLastError();
  if (err == cudaSuccess) err = pending;
  std::snprintf(message, message_len, "%s", v.c_str());
  if (!v.empty()) return -1;
  return static_cast<int>(err);
}

// memcpy, but an empty output (a null data pointer from torch) is fine.
void copy_out(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

size_t logits_bytes(int type) { return type == 0 ? 4 : 2; }

float weight_at(const void* x, xkernels::cuda::WeightType type, int64_t i) {
  return type == xkernels::cuda::WeightType::kFloat32 ? static_cast<const float*>(x)[i]
                                                      : __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
}

// The read's GEMM, which the binding runs with cuBLAS, computed here on the CPU to its contract
// (refine_launch.h): float32 sums of the given elements.
cudaError_t emu_read_gemm(void*, const xkernels::cuda::ReadGemm& g, cudaStream_t) {
  for (int64_t i = 0; i < g.rows; ++i)
    for (int64_t j = 0; j < g.len; ++j) {
      float acc = 0.0f;
      for (int64_t c = 0; c < g.r; ++c) acc += weight_at(g.a, g.type, i * g.lda + c) * weight_at(g.b, g.type, j * g.r + c);
      g.out[i * g.len + j] = acc;
    }
  return cudaSuccess;
}

// The sampling arguments of the entries below, as the bindings' SamplingArgs hold them: the scalar
// parameters, per-row arrays (null or [n]), the scalar stream, seeds and offsets of `*_numel`
// elements (one: the scalar form read on the device; n: per request), and whether the stream is
// per request.
#define XK_EMU_SAMPLING_ARGS                                                                                \
  float inv_t, int32_t top_k, float top_p, float min_p, const float *temperature, const int32_t *top_k_rows, \
      const float *top_p_rows, const float *min_p_rows, uint64_t seed, uint64_t offset,                        \
      const int64_t *seed_tensor, int64_t seed_numel, const int64_t *offset_tensor, int64_t offset_numel,      \
      int per_request
#define XK_EMU_SAMPLING_FORWARD                                                                              \
  inv_t, top_k, top_p, min_p, temperature, top_k_rows, top_p_rows, min_p_rows, seed, offset, seed_tensor,    \
      seed_numel, offset_tensor, offset_numel, per_request

// The filter order of the views sampling_view makes (xk_emu_set_min_p_first; the ops' filter_order).
bool g_min_p_first = false;

// The SamplingView of n rows (the bindings' sampling_view), its arrays copied to the device.
xkernels::SamplingView sampling_view(Device& dev, int64_t n, XK_EMU_SAMPLING_ARGS) {
  xkernels::SamplingView s{};
  s.scalar = xkernels::RowSampling{inv_t, top_k, top_p, min_p, g_min_p_first};
  s.temperature = dev.copy(temperature, sizeof(float) * n);
  s.top_k = dev.copy(top_k_rows, sizeof(int32_t) * n);
  s.top_p = dev.copy(top_p_rows, sizeof(float) * n);
  s.min_p = dev.copy(min_p_rows, sizeof(float) * n);
  s.seed = seed, s.offset = offset;
  s.seed_ptr = dev.copy(seed_tensor, sizeof(int64_t) * seed_numel);
  s.offset_ptr = dev.copy(offset_tensor, sizeof(int64_t) * offset_numel);
  s.seed_per_row = seed_tensor && seed_numel == n;
  s.offset_per_row = offset_tensor && offset_numel == n;
  s.per_request = per_request != 0;
  return s;
}

// Whether some row may sample with a filter (the bindings' SamplingArgs::any_filter).
bool may_filter(const xkernels::SamplingView& s, int64_t v) {
  return (s.temperature || s.scalar.inv_t != 0.0f) &&
         (s.top_k || s.top_p || s.min_p || xkernels::filters_active(s.scalar, v));
}

}  // namespace

extern "C" {

// The filters' order of the launches that follow: vLLM's (min-p first) when on.
void xk_emu_set_min_p_first(int on) { g_min_p_first = on != 0; }

int xk_emu_chain_verify(const void* logits, int logits_type, const int64_t* draft, const void* q, int q_type,
                        int64_t n, int64_t k, int64_t v, float inv_t, uint64_t seed, uint64_t offset, const int64_t* seed_tensor,
                        const int64_t* offset_tensor, int num_sms, int64_t* accept_len, int64_t* out_tokens,
                        char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ChainVerifyParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), n * (k + 1) * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.draft = dev.copy(draft, sizeof(int64_t) * n * k);
  p.q = dev.copy(static_cast<const char*>(q), n * k * v * logits_bytes(q_type));
  p.q_dtype = static_cast<LogitsType>(q_type);
  p.n = n, p.k = k, p.v = v, p.inv_t = inv_t, p.seed = seed, p.offset = offset;
  p.seed_ptr = dev.copy(seed_tensor, sizeof(int64_t));
  p.offset_ptr = dev.copy(offset_tensor, sizeof(int64_t));
  p.accept_len = dev.alloc<int64_t>(sizeof(int64_t) * n, 0xA5);
  p.out_tokens = dev.alloc<int64_t>(sizeof(int64_t) * n * (k + 1), 0xA5);
  p.num_sms = num_sms;
  void* workspace = dev.alloc(chain_verify_workspace_bytes(p), 0xA5);
  const cudaError_t err = launch_chain_verify(p, workspace, nullptr);
  copy_out(accept_len, p.accept_len, sizeof(int64_t) * n);
  copy_out(out_tokens, p.out_tokens, sizeof(int64_t) * n * (k + 1));
  return finish(err, message, message_len);
}

int xk_emu_chain_ragged(const void* logits, int logits_type, const int64_t* draft, const int64_t* cu, const void* q,
                        int q_type, int64_t t, int64_t n, int64_t v, int64_t max_spec_len, XK_EMU_SAMPLING_ARGS, int block,
                        int32_t* out, int32_t* num_emitted, float* logprobs, int32_t* errors, char* message,
                        size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ChainRaggedParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), (t + n) * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.draft = dev.copy(draft, sizeof(int64_t) * t);
  p.cu = dev.copy(cu, sizeof(int64_t) * n);
  p.q = dev.copy(static_cast<const char*>(q), t * v * logits_bytes(q_type));
  p.q_dtype = static_cast<LogitsType>(q_type);
  p.t = t, p.n = n, p.v = v, p.max_spec_len = max_spec_len;
  p.s = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.block = block != 0;
  const int64_t width = max_spec_len + 1;
  p.out = dev.alloc<int32_t>(sizeof(int32_t) * n * width, 0xA5);
  p.num_emitted = dev.alloc<int32_t>(sizeof(int32_t) * n, 0xA5);
  p.logprobs = logprobs ? dev.alloc<float>(sizeof(float) * n * width, 0xA5) : nullptr;  // null: not asked for
  p.errors = errors ? dev.alloc<int32_t>(sizeof(int32_t) * n, 0) : nullptr;  // null: no flag
  if (errors) std::memcpy(p.errors, errors, sizeof(int32_t) * n);  // the caller's words, which the kernel ORs into
  void* workspace = dev.alloc(chain_ragged_workspace_bytes(p), 0xA5);
  const cudaError_t err = launch_chain_ragged(p, workspace, nullptr);
  copy_out(out, p.out, sizeof(int32_t) * n * width);
  copy_out(num_emitted, p.num_emitted, sizeof(int32_t) * n);
  if (logprobs) copy_out(logprobs, p.logprobs, sizeof(float) * n * width);
  if (errors) copy_out(errors, p.errors, sizeof(int32_t) * n);
  return finish(err, message, message_len);
}

// launch_row_cut over `rows` rows of `row_stride` elements (the last one only v of them); per-row
// parameter arrays are null or [requests]. cuts: [rows] FilterCut, as {val, idx} pairs.
int xk_emu_row_cut(const void* logits, int logits_type, int64_t rows, int64_t v, int64_t row_stride,
                   int64_t rows_per_request, int64_t requests, float inv_t, int32_t top_k, float top_p, float min_p,
                   const float* temperature, const int32_t* top_k_rows, const float* top_p_rows,
                   const float* min_p_rows, xkernels::FilterCut* cuts, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  RowCutParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), (rows > 0 ? (rows - 1) * row_stride + v : 0) *
                                                           logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.rows = rows, p.v = v, p.row_stride = row_stride, p.rows_per_request = rows_per_request;
  p.s = sampling_view(dev, requests, inv_t, top_k, top_p, min_p, temperature, top_k_rows, top_p_rows, min_p_rows, 0,
                      0, nullptr, 0, nullptr, 0, 0);  // a cut draws nothing
  p.cuts = dev.alloc<xkernels::FilterCut>(sizeof(xkernels::FilterCut) * rows, 0xA5);
  const cudaError_t err = launch_row_cut(p, nullptr);
  copy_out(cuts, p.cuts, sizeof(xkernels::FilterCut) * rows);
  return finish(err, message, message_len);
}

// op: 0 refine_step (tokens = prev_tokens [n, b]), 1 jacobi_refine, 2 sequential_refine
// (tokens = prefix_tokens [n, f + 1]). Weights are float32 (weight_type 0) or bfloat16 (1).
// read_mode: RefineReadMode (0 auto, 1 GEMM, 2 fused), on a device of compute capability 9.
// pick_only: RefineParams::pick_only.
int xk_emu_refine(int op, const float* ctx, const int64_t* tokens, int64_t tokens_len, const void* base,
                  int base_type, const void* emb, const void* mix, const void* w_gate, const void* w_up,
                  const void* w_down, const void* w_read, int weight_type, int64_t n, int64_t b, int64_t d, int64_t r,
                  int64_t h, int64_t v, XK_EMU_SAMPLING_ARGS, int64_t max_iters, int num_sms, int64_t slice_bytes,
                  int read_mode, int pick_only,
                  int64_t* out_tokens, float* out_logprobs, int32_t* out_iters, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  const size_t wb = weight_type == 0 ? 4 : 2;
  const int64_t f = b - d;
  RefineParams p{};
  p.ctx = dev.copy(ctx, sizeof(float) * n * b * r);
  p.prefix = dev.copy(tokens, sizeof(int64_t) * n * tokens_len);
  p.prefix_len = tokens_len;
  p.base = dev.copy(static_cast<const char*>(base), n * d * v * logits_bytes(base_type));
  p.base_type = static_cast<LogitsType>(base_type);
  p.emb = dev.copy(static_cast<const char*>(emb), v * r * wb);
  p.mix = dev.copy(static_cast<const char*>(mix), r * b * b * wb);
  p.w_gate = dev.copy(static_cast<const char*>(w_gate), h * r * wb);
  p.w_up = dev.copy(static_cast<const char*>(w_up), h * r * wb);
  p.w_down = dev.copy(static_cast<const char*>(w_down), r * h * wb);
  p.w_read = dev.copy(static_cast<const char*>(w_read), v * r * wb);
  p.weight_type = static_cast<WeightType>(weight_type);
  p.n = n, p.b = b, p.d = d, p.f = f, p.r = r, p.h = h, p.v = v;
  p.num_sms = num_sms, p.slice_bytes = slice_bytes;
  p.s = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.filter = may_filter(p.s, v);
  p.cc_major = 9, p.read_mode = static_cast<RefineReadMode>(read_mode);
  p.pick_only = pick_only != 0;
  const ReadGemmRunner gemm{emu_read_gemm, nullptr};
  void* workspace = dev.alloc(refine_workspace_bytes(p), 0xA5);
  // The callers zero-fill what the launchers' contracts say (csrc/cuda/refine.cpp).
  int64_t* tok = dev.alloc<int64_t>(sizeof(int64_t) * n * d, op == 2 ? 0 : 0xA5);
  float* lp = dev.alloc<float>(sizeof(float) * n * d, 0xA5);
  int32_t* it = dev.alloc<int32_t>(sizeof(int32_t) * n, 0);
  cudaError_t err = cudaErrorInvalidValue;
  if (op == 0) err = launch_refine_step(p, gemm, workspace, tok, lp, nullptr);
  if (op == 1) err = launch_jacobi_refine(p, gemm, max_iters, workspace, tok, lp, it, nullptr);
  if (op == 2) err = launch_sequential_refine(p, gemm, workspace, tok, lp, nullptr);
  copy_out(out_tokens, tok, sizeof(int64_t) * n * d);
  copy_out(out_logprobs, lp, sizeof(float) * n * d);
  if (out_iters) copy_out(out_iters, it, sizeof(int32_t) * n);
  return finish(err, message, message_len);
}

// The binding's host planning of the refine read for `rows` rows: plan = {fused, partials, chunk,
// chunks, chunks_per_slice, slice, slices, m_tiles, groups, blocks, tiles, smem_bytes}, and the
// workspace bytes of the op's shapes. w_read_offset: bytes past a 256-byte aligned address.
void xk_emu_refine_plan(int64_t n, int64_t b, int64_t d, int64_t r, int64_t h, int64_t v, int weight_type,
                        int num_sms, int64_t slice_bytes, int read_mode, int cc_major, int64_t w_read_offset,
                        int64_t rows, int read, int64_t* plan, uint64_t* workspace_bytes) {
  using namespace xkernels::cuda;
  RefineParams p{};
  p.n = n, p.b = b, p.d = d, p.f = b - d, p.r = r, p.h = h, p.v = v;
  p.weight_type = static_cast<WeightType>(weight_type);
  p.num_sms = num_sms, p.slice_bytes = slice_bytes;
  p.read_mode = static_cast<RefineReadMode>(read_mode), p.cc_major = cc_major;
  p.w_read = reinterpret_cast<const void*>(static_cast<uintptr_t>(4096 + w_read_offset));  // only its alignment is read
  const RefineReadPlan x = refine_read_plan(p, rows, read != 0);
  const int64_t fields[] = {x.fused, x.partials, x.chunk, x.chunks, x.chunks_per_slice, x.slice,
                            x.slices, x.m_tiles, x.groups, x.blocks, x.tiles, x.smem_bytes};
  std::memcpy(plan, fields, sizeof(fields));
  *workspace_bytes = refine_workspace_bytes(p);
}

// With mask (not null) the tree's mask too, packed bits or bool bytes.
int xk_emu_build_draft_tree(const float* lp, const int64_t* tok, int64_t n, int64_t d, int64_t k, int64_t budget,
                            int64_t* tokens, int64_t* parents, int64_t* depth, int64_t* num_nodes, void* mask,
                            int packed, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  const int64_t m = budget + 1;
  TreeBuildParams p{dev.copy(lp, sizeof(float) * n * d * k), dev.copy(tok, sizeof(int64_t) * n * d * k), n, d, k,
                    budget, dev.alloc<int64_t>(sizeof(int64_t) * n * m, 0xA5), dev.alloc<int64_t>(sizeof(int64_t) * n * m, 0xA5),
                    dev.alloc<int64_t>(sizeof(int64_t) * n * m, 0xA5), dev.alloc<int64_t>(sizeof(int64_t) * n, 0xA5)};
  const size_t mask_bytes = static_cast<size_t>(n * m * (packed ? (m + 7) / 8 : m));
  if (mask) p.mask = dev.alloc<uint8_t>(mask_bytes, 0xA5), p.packed = packed != 0;
  const cudaError_t err = launch_build_draft_tree(p, dev.alloc(tree_build_workspace_bytes(p), 0xA5), nullptr);
  copy_out(tokens, p.out_tokens, sizeof(int64_t) * n * m);
  copy_out(parents, p.parents, sizeof(int64_t) * n * m);
  copy_out(depth, p.depth, sizeof(int64_t) * n * m);
  copy_out(num_nodes, p.num_nodes, sizeof(int64_t) * n);
  if (mask) copy_out(mask, p.mask, mask_bytes);
  return finish(err, message, message_len);
}

// The mask (want_depth = 0; packed bits or bool bytes) or the positions (want_depth = 1) into out.
int xk_emu_tree_mask(const int64_t* parents, const int64_t* num_nodes, int64_t n, int64_t m, int packed,
                     int want_depth, void* out, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  const size_t bytes = want_depth ? sizeof(int64_t) * n * m : static_cast<size_t>(n * m * (packed ? (m + 7) / 8 : m));
  void* result = dev.alloc(bytes, 0xA5);
  TreeMaskParams p{dev.copy(parents, sizeof(int64_t) * n * m), dev.copy(num_nodes, sizeof(int64_t) * n), n, m,
                   packed != 0, want_depth ? nullptr : static_cast<uint8_t*>(result),
                   want_depth ? static_cast<int64_t*>(result) : nullptr};
  const cudaError_t err = launch_tree_mask(p, nullptr);
  copy_out(out, result, bytes);
  return finish(err, message, message_len);
}

int xk_emu_tree_verify(const int64_t* tokens, const int64_t* parents, const int64_t* num_nodes, const void* logits,
                       int logits_type, const void* q, int q_type, int without_replacement, int64_t n, int64_t m,
                       int64_t v, XK_EMU_SAMPLING_ARGS, int may_sample, int filtered, int num_sms, int max_smem,
                       int clusters, int64_t* accept_len, int64_t* path, int64_t* out_tokens, char* message,
                       size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  TreeVerifyParams p{};
  p.tokens = dev.copy(tokens, sizeof(int64_t) * n * m);
  p.parents = dev.copy(parents, sizeof(int64_t) * n * m);
  p.num_nodes = dev.copy(num_nodes, sizeof(int64_t) * n);
  p.logits = dev.copy(static_cast<const char*>(logits), n * m * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.q = dev.copy(static_cast<const char*>(q), n * m * v * logits_bytes(q_type));
  p.q_dtype = static_cast<LogitsType>(q_type);
  p.without_replacement = without_replacement != 0;
  p.n = n, p.m = m, p.v = v, p.num_sms = num_sms;
  p.s = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.may_sample = may_sample != 0, p.filtered = filtered != 0;
  p.max_smem = max_smem;
  p.clusters = clusters != 0;
  p.accept_len = dev.alloc<int64_t>(sizeof(int64_t) * n, 0xA5);
  p.path = dev.alloc<int64_t>(sizeof(int64_t) * n * m, 0xA5);
  p.out_tokens = dev.alloc<int64_t>(sizeof(int64_t) * n * m, 0xA5);
  const cudaError_t err = launch_tree_verify(p, dev.alloc(tree_verify_workspace_bytes(p), 0xA5), nullptr);
  copy_out(accept_len, p.accept_len, sizeof(int64_t) * n);
  copy_out(path, p.path, sizeof(int64_t) * n * m);
  copy_out(out_tokens, p.out_tokens, sizeof(int64_t) * n * m);
  return finish(err, message, message_len);
}

// cache: contiguous [n, heads, len, d] of elem-byte elements, moved in place (copied in and out).
int xk_emu_compact_kv(void* cache, int64_t n, int64_t heads, int64_t len, int64_t d, int64_t elem,
                      const int64_t* path, const int64_t* accept_len, int64_t m, int64_t prefix_len, char* message,
                      size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  const size_t bytes = static_cast<size_t>(n * heads * len * d * elem);
  char* c = const_cast<char*>(dev.copy(static_cast<const char*>(cache), bytes));
  CompactKvParams p{c, heads * len * d, len * d, d, n, heads, len, d, elem, dev.copy(path, sizeof(int64_t) * n * m),
                    dev.copy(accept_len, sizeof(int64_t) * n), m, prefix_len};
  const cudaError_t err = launch_compact_kv(p, nullptr);
  copy_out(cache, c, bytes);
  return finish(err, message, message_len);
}

int xk_emu_dllm_step(const void* logits, int logits_type, const int64_t* block, int64_t n, int64_t l, int64_t v,
                     int64_t mask_id, int64_t num_unmask, int use_threshold, float threshold, XK_EMU_SAMPLING_ARGS,
                     int num_sms, int radix_only, int64_t* new_block, int64_t* positions, int64_t* tokens,
                     float* confidence, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  DllmParams p{};
  p.radix_only = radix_only != 0;
  p.logits = dev.copy(static_cast<const char*>(logits), n * l * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.block = dev.copy(block, sizeof(int64_t) * n * l);
  p.n = n, p.l = l, p.v = v, p.num_sms = num_sms;
  const xkernels::SamplingView view = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.rule = DllmRule{mask_id, num_unmask, use_threshold != 0, threshold, view, may_filter(view, v)};
  p.new_block = const_cast<int64_t*>(dev.copy(block, sizeof(int64_t) * n * l));  // the caller's copy of block
  p.positions = dev.alloc<int64_t>(sizeof(int64_t) * n * l, 0xFF);  // -1, as the caller fills them
  p.tokens = dev.alloc<int64_t>(sizeof(int64_t) * n * l, 0xFF);
  p.confidence = dev.alloc<float>(sizeof(float) * n * l, 0xA5);
  const cudaError_t err = launch_dllm_step(p, dev.alloc(dllm_workspace_bytes(p), 0xA5), nullptr);
  copy_out(new_block, p.new_block, sizeof(int64_t) * n * l);
  copy_out(positions, p.positions, sizeof(int64_t) * n * l);
  copy_out(tokens, p.tokens, sizeof(int64_t) * n * l);
  copy_out(confidence, p.confidence, sizeof(float) * n * l);
  return finish(err, message, message_len);
}

// The stream arguments are not read (materialize draws nothing).
int xk_emu_spiffy_materialize(const void* logits, int logits_type, const int64_t* block, int64_t n, int64_t l,
                              int64_t v, int64_t mask_id, const int32_t* ranks, const int32_t* child_ptr,
                              const int32_t* children, int64_t g, int64_t k, int64_t e, int64_t keep,
                              XK_EMU_SAMPLING_ARGS, int num_sms, int64_t* drafts, int64_t* node_ids, float* scores,
                              char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  SpiffyMaterializeParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), n * l * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.block = dev.copy(block, sizeof(int64_t) * n * l);
  p.graph = xkernels::GraphView{dev.copy(ranks, sizeof(int32_t) * g * k * 2), dev.copy(child_ptr, sizeof(int32_t) * (g + 1)),
                                dev.copy(children, sizeof(int32_t) * e), g, k, e};
  p.n = n, p.l = l, p.v = v, p.mask_id = mask_id, p.keep = keep, p.num_sms = num_sms;
  p.s = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.filtered = may_filter(p.s, v);
  p.drafts = dev.alloc<int64_t>(sizeof(int64_t) * n * keep * l, 0xA5);
  p.node_ids = dev.alloc<int64_t>(sizeof(int64_t) * n * keep, 0xFF);  // -1 and 0, as the caller fills them
  p.scores = dev.alloc<float>(sizeof(float) * n * keep, 0);
  const cudaError_t err = launch_spiffy_materialize(p, dev.alloc(spiffy_materialize_workspace_bytes(p), 0xA5), nullptr);
  copy_out(drafts, p.drafts, sizeof(int64_t) * n * keep * l);
  copy_out(node_ids, p.node_ids, sizeof(int64_t) * n * keep);
  copy_out(scores, p.scores, sizeof(float) * n * keep);
  return finish(err, message, message_len);
}

int xk_emu_spiffy_accept(const void* root, const void* draft_logits, int logits_type, const int64_t* drafts,
                         const int64_t* node_ids, const int64_t* block, int64_t n, int64_t l, int64_t v, int64_t k,
                         int64_t mask_id, int64_t num_unmask, int use_threshold, float threshold, XK_EMU_SAMPLING_ARGS,
                         int clusters, int radix_only, int64_t* num_steps, int64_t* positions, int64_t* tokens,
                         int64_t* new_block, int64_t* continue_from, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  SpiffyAcceptParams p{};
  p.clusters = clusters != 0;
  p.radix_only = radix_only != 0;
  p.root_logits = dev.copy(static_cast<const char*>(root), n * l * v * logits_bytes(logits_type));
  p.draft_logits = dev.copy(static_cast<const char*>(draft_logits), n * k * l * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.drafts = dev.copy(drafts, sizeof(int64_t) * n * k * l);
  p.node_ids = dev.copy(node_ids, sizeof(int64_t) * n * k);
  p.n = n, p.l = l, p.v = v, p.k = k;
  const xkernels::SamplingView view = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  p.rule = DllmRule{mask_id, num_unmask, use_threshold != 0, threshold, view, may_filter(view, v)};
  p.new_block = const_cast<int64_t*>(dev.copy(block, sizeof(int64_t) * n * l));
  p.positions = dev.alloc<int64_t>(sizeof(int64_t) * n * l, 0xFF);
  p.tokens = dev.alloc<int64_t>(sizeof(int64_t) * n * l, 0xFF);
  p.num_steps = dev.alloc<int64_t>(sizeof(int64_t) * n, 0);
  p.continue_from = dev.alloc<int64_t>(sizeof(int64_t) * n, 0xFF);
  const cudaError_t err = launch_spiffy_accept(p, dev.alloc(spiffy_accept_workspace_bytes(p), 0xA5), nullptr);
  copy_out(num_steps, p.num_steps, sizeof(int64_t) * n);
  copy_out(positions, p.positions, sizeof(int64_t) * n * l);
  copy_out(tokens, p.tokens, sizeof(int64_t) * n * l);
  copy_out(new_block, p.new_block, sizeof(int64_t) * n * l);
  copy_out(continue_from, p.continue_from, sizeof(int64_t) * n);
  return finish(err, message, message_len);
}

// The asynchronous error flag of n rows (launch_param_errors): `errors` holds the caller's words,
// which the kernel ORs into (an exact [n] device copy, so AddressSanitizer flags any write past it).
int xk_emu_param_errors(int64_t n, XK_EMU_SAMPLING_ARGS, int32_t* errors, char* message, size_t message_len) {
  Device dev;
  const xkernels::SamplingView view = sampling_view(dev, n, XK_EMU_SAMPLING_FORWARD);
  int32_t* words = const_cast<int32_t*>(dev.copy(errors, sizeof(int32_t) * n));
  const cudaError_t err = xkernels::cuda::launch_param_errors(view, n, words, nullptr);
  copy_out(errors, words, sizeof(int32_t) * n);
  return finish(err, message, message_len);
}

// The binding's planning of spiffy_accept for n sequences of l positions: blocks a sequence and
// workspace bytes.
void xk_emu_spiffy_accept_plan(int64_t n, int64_t l, int clusters, unsigned* blocks, size_t* bytes) {
  xkernels::cuda::SpiffyAcceptParams p{};
  p.n = n, p.l = l, p.clusters = clusters != 0;
  *blocks = xkernels::cuda::spiffy_accept_blocks(p);
  *bytes = xkernels::cuda::spiffy_accept_workspace_bytes(p);
}

int xk_emu_spiffy_attention_mask(const int64_t* prefix_lens, int64_t n, int64_t num_drafts, int64_t block_size,
                                 int64_t max_prefix, int packed, uint8_t* mask, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  const int64_t q = (1 + num_drafts) * block_size, keys = max_prefix + q;
  const size_t bytes = n * q * (packed ? (keys + 7) / 8 : keys);
  SpiffyMaskParams p{dev.copy(prefix_lens, sizeof(int64_t) * n), n, num_drafts, block_size, max_prefix, packed != 0,
                     dev.alloc<uint8_t>(bytes, 0xA5)};
  const cudaError_t err = launch_spiffy_attention_mask(p, nullptr);
  copy_out(mask, p.mask, bytes);
  return finish(err, message, message_len);
}

int xk_emu_shard_row_stats(const void* logits, int logits_type, const int64_t* rows, const int64_t* exclude,
                           const float* draft_probs, const float* residual_stats, int64_t n, int64_t r, int64_t v,
                           int64_t s, int64_t e, int64_t q, int64_t vocab_start, int64_t ignore_id, int sample,
                           int raw_stats, float inv_t, const float* temperature, uint64_t seed, uint64_t offset,
                           const int64_t* seed_tensor, int64_t seed_numel, const int64_t* offset_tensor,
                           int64_t offset_numel, int per_request, const float* cut_value, const int32_t* cut_id,
                           float* row_max,
                           float* row_sum, int64_t* top_id, float* pick_score, int64_t* pick_id, float* pick_logit,
                           char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ShardRowStatsParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), n * r * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.n = n, p.r = r, p.v = v, p.s = s, p.e = e, p.q = q;
  p.vocab_start = vocab_start, p.ignore_id = ignore_id;
  p.rows = dev.copy(rows, sizeof(int64_t) * n * s);
  p.exclude = dev.copy(exclude, sizeof(int64_t) * n * s * e);
  p.draft_probs = dev.copy(draft_probs, sizeof(float) * n * q * v);
  p.residual_stats = dev.copy(residual_stats, sizeof(float) * n * s * 2);
  p.sample = sample != 0, p.raw_stats = raw_stats != 0;
  p.s_args = sampling_view(dev, n, inv_t, 0, 1.0f, 0.0f, temperature, nullptr, nullptr, nullptr, seed, offset,
                           seed_tensor, seed_numel, offset_tensor, offset_numel, per_request);  // no filters
  p.cut_value = dev.copy(cut_value, sizeof(float) * n * s);
  p.cut_id = dev.copy(cut_id, sizeof(int32_t) * n * s);
  const size_t f = sizeof(float) * n * s, i = sizeof(int64_t) * n * s;
  p.row_max = dev.alloc<float>(f, 0xA5), p.row_sum = dev.alloc<float>(f, 0xA5);
  p.pick_score = dev.alloc<float>(f, 0xA5), p.pick_logit = dev.alloc<float>(f, 0xA5);
  p.top_id = dev.alloc<int64_t>(i, 0xA5), p.pick_id = dev.alloc<int64_t>(i, 0xA5);
  const cudaError_t err = launch_shard_row_stats(p, nullptr);
  copy_out(row_max, p.row_max, f), copy_out(row_sum, p.row_sum, f), copy_out(pick_score, p.pick_score, f);
  copy_out(pick_logit, p.pick_logit, f), copy_out(top_id, p.top_id, i), copy_out(pick_id, p.pick_id, i);
  return finish(err, message, message_len);
}

// out [r, 2, 256] starts at 0: the launcher's contract (the binding zero-fills it; the kernel adds).
int xk_emu_shard_cut_histogram(const void* logits, int logits_type, int64_t r, int64_t v, int64_t vocab_start,
                               int64_t ignore_id, const float* scale, const int64_t* prefix, int shift,
                               const float* row_max, const float* keep_value, const int32_t* keep_id, int64_t* out,
                               char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ShardCutHistogramParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), r * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.r = r, p.v = v, p.vocab_start = vocab_start, p.ignore_id = ignore_id;
  p.scale = dev.copy(scale, sizeof(float) * r);
  p.prefix = dev.copy(prefix, sizeof(int64_t) * r);
  p.shift = shift;
  p.row_max = dev.copy(row_max, sizeof(float) * r);
  p.keep_value = dev.copy(keep_value, sizeof(float) * r);
  p.keep_id = dev.copy(keep_id, sizeof(int32_t) * r);
  const size_t bytes = sizeof(int64_t) * r * 2 * 256;
  p.out = dev.alloc<int64_t>(bytes, 0);
  const cudaError_t err = launch_shard_cut_histogram(p, nullptr);
  copy_out(out, p.out, bytes);
  return finish(err, message, message_len);
}

// prefix [r] and before [r, 2] are read and written in place (the binding's copies).
int xk_emu_shard_cut_pick(const int64_t* hist, int64_t r, int64_t parts, const double* target, int64_t* prefix,
                          int64_t* before, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ShardCutPickParams p{dev.copy(hist, sizeof(int64_t) * r * parts * 256), r, parts,
                       dev.copy(target, sizeof(double) * r), nullptr, nullptr};
  p.prefix = const_cast<int64_t*>(dev.copy(prefix, sizeof(int64_t) * r));
  p.before = const_cast<int64_t*>(dev.copy(before, sizeof(int64_t) * r * 2));
  const cudaError_t err = launch_shard_cut_pick(p, nullptr);
  copy_out(prefix, p.prefix, sizeof(int64_t) * r), copy_out(before, p.before, sizeof(int64_t) * r * 2);
  return finish(err, message, message_len);
}

// keys [r, count] written whole; weights [r, count, 2] start at 0 (the binding zero-fills them), or
// null without row_max.
int xk_emu_shard_cut_candidates(const void* logits, int logits_type, int64_t r, int64_t v, int64_t vocab_start,
                                int64_t ignore_id, int64_t count, const float* scale, const float* row_max,
                                int64_t* keys, int64_t* weights, char* message, size_t message_len) {
  using namespace xkernels::cuda;
  Device dev;
  ShardCutCandidatesParams p{};
  p.logits = dev.copy(static_cast<const char*>(logits), r * v * logits_bytes(logits_type));
  p.dtype = static_cast<LogitsType>(logits_type);
  p.r = r, p.v = v, p.vocab_start = vocab_start, p.ignore_id = ignore_id, p.count = count;
  p.scale = dev.copy(scale, sizeof(float) * r);
  p.row_max = dev.copy(row_max, sizeof(float) * r);
  const size_t key_bytes = sizeof(int64_t) * r * count, weight_bytes = 2 * key_bytes;
  p.keys = dev.alloc<int64_t>(key_bytes, 0xA5);
  p.weights = row_max ? dev.alloc<int64_t>(weight_bytes, 0) : nullptr;
  const cudaError_t err = launch_shard_cut_candidates(p, nullptr);
  copy_out(keys, p.keys, key_bytes);
  if (row_max) copy_out(weights, p.weights, weight_bytes);
  return finish(err, message, message_len);
}

// blocks a row takes (the launcher's grid.y)
int64_t xk_emu_shard_cut_blocks_per_row(int64_t r, int64_t v) { return xkernels::cuda::shard_cut_blocks_per_row(r, v); }

// xkernels/sampling.h's gumbel_cannot_win (host math, as the CPU kernels and this emulation run it)
// against the score it rules out: for pair i (log weight w[i], or with `linear` the weight r = w[i]
// and gumbel_cannot_win_linear, best score best[i]) and its `per_pair` Philox words, counts the words
// it skips and the skipped words whose score (w or logf(r), + gumbel_from_word) would not have been
// strictly below best (each a changed draw).
void xk_emu_gumbel_gate_check(const float* w, const float* best, const uint32_t* words, int64_t pairs,
                              int64_t per_pair, int linear, int64_t* skips, int64_t* errors) {
  *skips = *errors = 0;
  for (int64_t i = 0; i < pairs; ++i) {
    const xkernels::GumbelGate gate = xkernels::gumbel_gate(best[i]);
    const float scale = xkernels::gumbel_gate_scale(gate), log_weight = linear ? xkernels::log_f32(w[i]) : w[i];
    for (int64_t j = 0; j < per_pair; ++j) {
      const uint32_t word = words[i * per_pair + j];
      if (!(linear ? xkernels::gumbel_cannot_win_linear(scale, w[i], word)
                   : xkernels::gumbel_cannot_win(gate, w[i], word)))
        continue;
      ++*skips;
      *errors += !(log_weight + xkernels::gumbel_from_word(word) < best[i]);
    }
  }
}

// The passes over a row since the last call (xk_emu::take_row_passes).
uint64_t xk_emu_take_row_passes() { return xk_emu::take_row_passes(); }

// The cluster launches since the last call (xk_emu::take_cluster_launches).
uint64_t xk_emu_take_cluster_launches() { return xk_emu::take_cluster_launches(); }

// The kernels that have run a block so far, comma-separated, into buffer.
void xk_emu_launched_kernels(char* buffer, size_t len) {
  std::snprintf(buffer, len, "%s", xk_emu::launched_kernels().c_str());
}

}  // extern "C"
