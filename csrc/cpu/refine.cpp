// refine_step, jacobi_refine and sequential_refine on the CPU. The small front of a
// pass (gather, mix, SwiGLU over B slots in rank space) uses ATen; the read is
// fused: vocabulary chunks that stay in cache run in parallel, each one vendor GEMM
// (at::mm: MKL/oneDNN) for all rows then one epilogue (bias add, scale, Gumbel-max,
// softmax statistics), so the [rows, V] logits are never materialised. Rows whose request
// samples with top-k, top-p or min-p are the exception: the epilogue copies their scaled
// logits to a V-float row each, which filter_row (top_filter.h) cuts before they are sampled.
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <type_traits>
#include <vector>

#include "../ops/checks.h"
#include "../ops/refine_read.h"
#include "dispatch.h"
#include "../ops/sampling_args.h"
#include "read_stats.h"
#include "row_reduce.h"
#include "top_filter.h"
#include "xkernels/param_errors.h"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels {
namespace {

// The read in vocabulary slices: one vendor GEMM a slice (at::mm, threaded by MKL/oneDNN and,
// with bfloat16 weights, on AMX where the CPU has it), whose products (at most kSliceBytes, half of
// a core's 2 MB L2 here, so they stay beside w_read's stream; or kMinSlice ids: each GEMM call has
// a fixed cost) the epilogue then reads from cache, chunks of
// kChunk ids in parallel. The GEMM computes the products id-major, w_read_slice z^T [ids, rows]:
// with few rows the vendor then streams w_read as it lies instead of first repacking it for
// z w_read^T (measured with MKL, one thread, V=32768, r=256: 1.6x faster at 15 rows, 1.05x at
// 120, never slower; bfloat16 1.5x).
constexpr int64_t kSliceBytes = 1 << 20;
constexpr int64_t kMinSlice = 4096;
constexpr int64_t kChunk = 1024;  // a multiple of 4: a Philox draw covers 4 ids

struct Weights {
  at::Tensor emb, mix, w_gate, w_up, w_down, w_read;
};

// The Mix step, channel-major: x [N, B, r] (float32) -> u^T [r, N * B] with
// u[n, k, c] = sum_{j <= k} mix[c, k, j] x[n, j, c], reading only mix's lower triangle as it lies
// (c outermost). A loop, not tril + einsum: those cost more in dispatch and copies than its few
// FMAs (B = 16, r = 256: 35 K a sequence); x is transposed instead of mix, which is 16x larger.
at::Tensor mix_slots_t(const at::Tensor& x, const at::Tensor& mix) {
  const int64_t n = x.size(0), b = x.size(1), r = x.size(2);
  const at::Tensor m = mix.to(at::kFloat).contiguous();
  const at::Tensor xt = x.permute({2, 0, 1}).contiguous();  // [c, n, j]
  auto out = at::empty({r, n * b}, x.options());
  const float* mp = m.const_data_ptr<float>();
  const float* xp = xt.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t c = 0; c < r; ++c)
    for (int64_t s = 0; s < n; ++s) {
      const float* xs = xp + (c * n + s) * b;
      for (int64_t k = 0; k < b; ++k) {
        const float* mk = mp + (c * b + k) * b;
        float acc = 0.0f;
        for (int64_t j = 0; j <= k; ++j) acc += mk[j] * xs[j];
        op[c * n * b + s * b + k] = acc;
      }
    }
  return out;
}

// z [N, B, r] (float32) of one pass. The products are computed id-major (weight u^T), like the
// read's: the vendor GEMM then streams the weights as they lie instead of repacking them each call
// (MKL, one thread, 16 rows: about 1.1-1.5x faster in scratch timings on a shared machine).
at::Tensor hidden_states(const at::Tensor& ctx, const at::Tensor& prev, const Weights& w) {
  const int64_t n = ctx.size(0), b = ctx.size(1), r = ctx.size(2);
  const auto ut = mix_slots_t(ctx + w.emb.index_select(0, prev.reshape({-1})).reshape({n, b, r}).to(at::kFloat), w.mix);
  const auto act = at::silu(at::mm(w.w_gate.to(at::kFloat), ut)) * at::mm(w.w_up.to(at::kFloat), ut);  // [H, N * B]
  return (ut + at::mm(w.w_down.to(at::kFloat), act)).t().reshape({n, b, r});
}

// One row of the read: base logits s, its request's parameters and stream, its drafted slot
// (the noise of id v: draw v / 4 of st at that slot).
template <typename T>
struct ReadRow {
  const T* s;
  RowSampling rs;
  RowStream st;
  uint32_t slot;

  bool greedy() const { return rs.inv_t == 0.0f; }
  float scale() const { return greedy() ? 1.0f : rs.inv_t; }
  // Sampled with a filter: the row's logits are materialised (filtered_row below).
  bool filtered(int64_t v) const { return !greedy() && filters_active(rs, v); }
};

// Rows of the epilogue's buffer are kRowStride floats apart, not a power of two: kChunk-float rows
// would all map to the same L1 sets and evict each other while a chunk is transposed.
constexpr int64_t kRowStride = kChunk + 16;

// out[m * kRowStride + i] = (s_m[u0 + i] + products[i * rows + m]) * scale_m (no products: s * scale_m):
// a chunk's scaled logits as rows, the id-major products transposed 8 x 8 in registers on the way.
// scale: the rows' common scale, or 0 when they differ; then the sums are scaled row by row after
// (x * 1 is exact, so the result is the same). bias: scratch for the rows' pointers.
template <typename T, typename P>
void chunk_logits(const std::vector<ReadRow<T>>& rows, int64_t u0, const P* products, int64_t n_ids, float scale,
                  std::vector<const T*>& bias, float* out) {
  const int64_t m_rows = static_cast<int64_t>(rows.size());
  for (int64_t m = 0; m < m_rows; ++m) bias[m] = rows[m].s + u0;
  if (products)
    cpu::transpose_add_scale(products, n_ids, m_rows, bias.data(), scale == 0.0f ? 1.0f : scale, out, kRowStride);
  for (int64_t m = 0; m < m_rows; ++m) {
    float* a = out + m * kRowStride;
    if (!products) {
      cpu::scale_row(bias[m], n_ids, scale == 0.0f ? rows[m].scale() : scale, a);
    } else if (scale == 0.0f && rows[m].scale() != 1.0f) {
      const float row_scale = rows[m].scale();
      for (int64_t i = 0; i < n_ids; ++i) a[i] *= row_scale;
    }
  }
}

// The rows' common scale, or 0 when they differ.
template <typename T>
float common_scale(const std::vector<ReadRow<T>>& rows) {
  for (const auto& row : rows)
    if (row.scale() != rows[0].scale()) return 0.0f;
  return rows[0].scale();
}

// The token and log-probability of a filtered row from its V scaled logits a (cut in place):
// Gumbel-max over p' with the row's noise (the draws the chunked epilogue makes), log p'(token).
// A row without a softmax is a point mass at its argmax (log-prob NaN), as sampled_token says.
template <typename T>
void filtered_row(const ReadRow<T>& row, float* a, int64_t v, cpu::FilterScratch& scratch, int64_t* token,
                  float* logprob) {
  RowStats s = cpu::row_stats(a, v);
  if (stats_degenerate(s)) {
    *token = s.top.idx == kNoIndex ? 0 : s.top.idx;
    *logprob = __builtin_nanf("");
    return;
  }
  s = cpu::filter_row(a, v, s, row.rs, scratch);
  const ArgMax best = cpu::sample_logits(row.st.seed, row.st.offset_at(row.slot), row.st.sequence_at(),
                                         row.st.position_at(row.slot), a, v, -1);
  const int32_t x = best.idx == kNoIndex ? s.top.idx : best.idx;
  *token = x;
  *logprob = a[x] - s.top.val - log_f32(s.sum);
}

// Each row's token and log-prob from its chunks' partial results (partial[m * chunks + c]).
void merge_rows(const std::vector<SampledRow>& partial, int64_t m_rows, int64_t chunks, int64_t* tokens,
                float* logprobs) {
  for (int64_t m = 0; m < m_rows; ++m) {
    SampledRow r = sampled_empty();
    for (int64_t c = 0; c < chunks; ++c) r = sampled_merge(r, partial[m * chunks + c]);
    tokens[m] = sampled_token(r);
    logprobs[m] = sampled_logprob(r);
  }
}

// The greedy read with float32 weights and base logits on AVX-512: cpu::read_stats fuses the GEMM
// and the statistics, chunks of kChunk ids in parallel (a chunk's 1 MB of w_read stays in L2 while
// each block of 64 rows reads it). The sliced path below spends about a third of its GEMM's time
// writing, transposing and re-reading the products at 60 rows.
void fused_greedy_read(const std::vector<ReadRow<float>>& rows, const at::Tensor& z, const at::Tensor& w_read,
                       int64_t v, SampledRow* partial) {
  const int64_t m_rows = static_cast<int64_t>(rows.size()), r = z.size(1), chunks = (v + kChunk - 1) / kChunk;
  auto packed = at::empty({cpu::packed_read_size(m_rows, r)}, z.options());  // z: float32, contiguous
  cpu::pack_read_rows(z.const_data_ptr<float>(), m_rows, r, packed.mutable_data_ptr<float>());
  std::vector<const float*> s(static_cast<size_t>(m_rows));
  for (int64_t m = 0; m < m_rows; ++m) s[m] = rows[m].s;
  // Each thread claims the next chunk when it is done with one, rather than an even share, so a core
  // that is also running other work takes fewer (on the shared 2-core dev machine one core ran the
  // kernel ~1.4x slower than the other in scratch timings).
  std::atomic<int64_t> next{0};
  at::parallel_for(0, chunks, 1, [&](int64_t, int64_t) {
    std::vector<RowStats> stats(static_cast<size_t>(m_rows));
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      cpu::read_stats(w_read.const_data_ptr<float>(), r, packed.const_data_ptr<float>(), m_rows, s.data(),
                      c * kChunk, std::min(v, (c + 1) * kChunk), stats.data());
      for (int64_t m = 0; m < m_rows; ++m) partial[m * chunks + c] = SampledRow{stats[m].top, stats[m].top.val, stats[m]};
    }
  });
}

// For each row m: l = s + w_read z_m (z undefined: l = s), then token = argmax(l/T + G)
// and logprob = log_softmax(l/T)[token], T the row's temperature; a filtered row samples from
// p' and scores under it. fused: the greedy float32 read may take read_stats.
template <typename T>
void read_and_sample(const std::vector<ReadRow<T>>& rows, const at::Tensor& z, const at::Tensor& w_read,
                     int64_t v, bool fused, int64_t* tokens, float* logprobs) {
  const int64_t m_rows = static_cast<int64_t>(rows.size());
  if (m_rows == 0) return;
  const int64_t chunks = (v + kChunk - 1) / kChunk;
  const int64_t slice = std::max(kMinSlice, kSliceBytes / static_cast<int64_t>(sizeof(float)) / m_rows) / kChunk * kChunk;
  bool greedy = true;
  std::vector<int64_t> full_at(static_cast<size_t>(m_rows), -1);  // the row's place in `full`, or -1
  int64_t filtered = 0;
  for (int64_t m = 0; m < m_rows; ++m) {
    greedy &= rows[m].greedy();
    if (rows[m].filtered(v)) full_at[m] = filtered++;
  }
  const float scale = common_scale(rows);
  // The filtered rows' scaled logits, V floats each: left uninitialised, every id is written.
  std::unique_ptr<float[]> full(filtered > 0 ? new float[filtered * v] : nullptr);
  // bfloat16 weights: a bfloat16 GEMM, as eager PyTorch runs it: z and each product are rounded
  // to bfloat16.
  const at::Tensor zr = z.defined() ? z.to(w_read.scalar_type()) : z;
  std::vector<SampledRow> partial(static_cast<size_t>(m_rows * chunks));
  if constexpr (std::is_same_v<T, float>) {
    if (fused && greedy && z.defined() && w_read.scalar_type() == at::kFloat) {
      fused_greedy_read(rows, z, w_read, v, partial.data());
      return merge_rows(partial, m_rows, chunks, tokens, logprobs);
    }
  }
  for (int64_t v0 = 0; v0 < v; v0 += slice) {
    const int64_t len = std::min(slice, v - v0), slice_chunks = (len + kChunk - 1) / kChunk;
    at::Tensor dots;  // [len, rows] in the weights' dtype, read as is (no conversion pass)
    if (z.defined()) dots = at::mm(w_read.narrow(0, v0, len), zr.t());
    at::parallel_for(0, slice_chunks, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer(static_cast<size_t>(kRowStride * m_rows));
      std::vector<const T*> bias(static_cast<size_t>(m_rows));
      for (int64_t c = begin; c < end; ++c) {
        const int64_t u0 = v0 + c * kChunk, n_ids = std::min(kChunk, v0 + len - u0);
        if (!dots.defined())
          chunk_logits(rows, u0, static_cast<const float*>(nullptr), n_ids, scale, bias, buffer.data());
        else if (dots.scalar_type() == at::kFloat)
          chunk_logits(rows, u0, dots.const_data_ptr<float>() + (u0 - v0) * m_rows, n_ids, scale, bias, buffer.data());
        else
          chunk_logits(rows, u0, dots.const_data_ptr<at::BFloat16>() + (u0 - v0) * m_rows, n_ids, scale,
                       bias, buffer.data());
        for (int64_t m = 0; m < m_rows; ++m) {
          const float* a = buffer.data() + m * kRowStride;
          if (full_at[m] >= 0) {
            std::copy(a, a + n_ids, full.get() + full_at[m] * v + u0);
            continue;
          }
          RowStats st = cpu::row_stats(a, n_ids);
          st.top.idx += static_cast<int32_t>(u0);
          SampledRow out{st.top, st.top.val, st};
          if (!rows[m].greedy()) {
            const ReadRow<T>& row = rows[m];
            const ArgMax best = cpu::sample_logits(row.st.seed, row.st.offset_at(row.slot), row.st.sequence_at(),
                                                   row.st.position_at(row.slot), a, n_ids, -1,
                                                   static_cast<uint32_t>(u0 / 4));
            out.pick = best.idx == kNoIndex ? best : ArgMax{best.val, best.idx + static_cast<int32_t>(u0)};
            out.pick_a = best.idx == kNoIndex ? kNegInf : a[best.idx];
          }
          partial[m * chunks + v0 / kChunk + c] = out;
        }
      }
    });
  }
  merge_rows(partial, m_rows, chunks, tokens, logprobs);
  if (filtered == 0) return;
  at::parallel_for(0, m_rows, 1, [&](int64_t begin, int64_t end) {
    cpu::FilterScratch scratch;
    for (int64_t m = begin; m < end; ++m)
      if (full_at[m] >= 0) filtered_row(rows[m], full.get() + full_at[m] * v, v, scratch, tokens + m, logprobs + m);
  });
}

// A checked call: its shape, sampling arguments, weights, contiguous base logits and whether its
// greedy float32 read runs fused (cpu_read_fused, read once a call).
struct Call {
  RefineShape s;
  SamplingArgs sampling;
  Weights w;
  at::Tensor logits;
  bool fused;
};

Call prepare(const at::Tensor& ctx, const at::Tensor& tokens, const char* tokens_name, bool tokens_are_prefix,
             const at::Tensor& base_logits, XK_REFINE_WEIGHT_ARGS, XK_SAMPLING_ARGS,
             const std::optional<at::Tensor>& errors, std::string_view filter_order) {
  check_devices(ctx, "ctx", {{errors, "errors"}});  // first, as the op's own tensors
  const auto s = check_refine(ctx, tokens, tokens_name, tokens_are_prefix, base_logits, emb, mix, w_gate, w_up,
                              w_down, w_read, temperature);
  check_token_ids(tokens, s.v, tokens_name);
  check_errors(errors, s.n);
  // With errors the per-row values are flagged, not raised, as on CUDA.
  Call call{s, sampling_args(s.n, ctx.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value()),
            Weights{emb, mix, w_gate, w_up, w_down, w_read.contiguous()}, base_logits.contiguous(), cpu_read_fused()};
  if (errors) or_param_errors(sampling_view(call.sampling), s.n, errors->mutable_data_ptr<int32_t>());
  return call;
}

using Rows = std::vector<std::pair<int64_t, int64_t>>;  // (sequence, drafted slot)

// Samples the given rows; z [rows, r] holds their hidden states (undefined: the drafter's
// own sample, s alone). Writes tokens[i] and logprobs[i] for row i.
void sample_rows(const at::Tensor& base_logits, const Rows& rows, const at::Tensor& z, const at::Tensor& w_read,
                 const SamplingArgs& sampling, bool fused, int64_t* tokens, float* logprobs) {
  const int64_t d = base_logits.size(1), v = base_logits.size(2);
  if (rows.empty()) return;
  cpu::dispatch_logits(base_logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* base = base_logits.const_data_ptr<T>();
    const SamplingView view = sampling_view(sampling);
    std::vector<ReadRow<T>> read;
    for (const auto& [n, slot] : rows)
      read.push_back({base + (n * d + slot) * v, view.row(n), view.stream(n), static_cast<uint32_t>(slot)});
    read_and_sample(read, z.defined() ? z.contiguous() : z, w_read, v, fused, tokens, logprobs);
  });
}

Rows all_rows(int64_t n, int64_t d) {
  Rows rows;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k) rows.emplace_back(i, k);
  return rows;
}

std::tuple<at::Tensor, at::Tensor> refine_step_cpu(const at::Tensor& ctx, const at::Tensor& prev_tokens,
                                                   const at::Tensor& base_logits, XK_REFINE_WEIGHT_ARGS,
                                                   XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
                                                   std::string_view filter_order) {
  const auto [s, sampling, w, logits, fused] = prepare(ctx, prev_tokens, "prev_tokens", false, base_logits, emb, mix,
                                                       w_gate, w_up, w_down, w_read, XK_SAMPLING_FORWARD, errors,
                                                       filter_order);
  auto tokens = at::empty({s.n, s.d}, prev_tokens.options());
  auto logprobs = at::empty({s.n, s.d}, ctx.options());
  const auto z = hidden_states(ctx, prev_tokens, w).narrow(1, s.f, s.d).reshape({s.n * s.d, s.r});
  sample_rows(logits, all_rows(s.n, s.d), z, w.w_read, sampling, fused, tokens.mutable_data_ptr<int64_t>(),
              logprobs.mutable_data_ptr<float>());
  return {tokens, logprobs};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> jacobi_refine_cpu(const at::Tensor& ctx,
                                                                 const at::Tensor& prefix_tokens,
                                                                 const at::Tensor& base_logits,
                                                                 XK_REFINE_WEIGHT_ARGS, int64_t max_iters,
                                                                 XK_SAMPLING_ARGS,
                                                                 const std::optional<at::Tensor>& errors,
                                                                 std::string_view filter_order) {
  TORCH_CHECK(max_iters >= 0, "max_iters must be >= 0, got ", max_iters);
  const auto [s, sampling, w, logits, fused] = prepare(ctx, prefix_tokens, "prefix_tokens", true, base_logits, emb, mix,
                                                       w_gate, w_up, w_down, w_read, XK_SAMPLING_FORWARD, errors,
                                                       filter_order);
  auto tokens = at::empty({s.n, s.d}, prefix_tokens.options());
  auto logprobs = at::empty({s.n, s.d}, ctx.options());
  auto iters = at::zeros({s.n}, prefix_tokens.options().dtype(at::kInt));
  int64_t* tok = tokens.mutable_data_ptr<int64_t>();
  float* lp = logprobs.mutable_data_ptr<float>();
  int32_t* it = iters.mutable_data_ptr<int32_t>();
  // x0: the drafter's sample
  sample_rows(logits, all_rows(s.n, s.d), at::Tensor(), w.w_read, sampling, fused, tok, lp);

  // Slots before first_dirty[n] read unchanged tokens, so they are final and are not recomputed.
  std::vector<int64_t> active(static_cast<size_t>(s.n)), first_dirty(static_cast<size_t>(s.n), 0);
  for (int64_t n = 0; n < s.n; ++n) active[n] = n;
  for (int64_t pass = 0; pass < max_iters && !active.empty(); ++pass) {
    const auto index = at::from_blob(active.data(), {static_cast<int64_t>(active.size())}, prefix_tokens.options());
    const auto prev = at::cat(
        std::vector<at::Tensor>{prefix_tokens.index_select(0, index), tokens.index_select(0, index).narrow(1, 0, s.d - 1)},
        1);
    Rows rows;
    std::vector<int64_t> z_rows;  // rows of hidden [active * B, r]
    for (size_t a = 0; a < active.size(); ++a)
      for (int64_t k = first_dirty[active[a]]; k < s.d; ++k) {
        rows.emplace_back(active[a], k);
        z_rows.push_back(static_cast<int64_t>(a) * s.b + s.f + k);
      }
    std::vector<int64_t> new_tok(rows.size());
    std::vector<float> new_lp(rows.size());
    if (!rows.empty()) {
      const auto hidden = hidden_states(ctx.index_select(0, index), prev, w).reshape({-1, s.r});
      const auto z = hidden.index_select(
          0, at::from_blob(z_rows.data(), {static_cast<int64_t>(z_rows.size())}, prefix_tokens.options()));
      sample_rows(logits, rows, z, w.w_read, sampling, fused, new_tok.data(), new_lp.data());
    }
    std::vector<int64_t> changed_first(static_cast<size_t>(s.n), -1);  // first changed slot per sequence
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto [n, k] = rows[i];
      if (tok[n * s.d + k] != new_tok[i] && changed_first[n] < 0) changed_first[n] = k;
      tok[n * s.d + k] = new_tok[i];
      lp[n * s.d + k] = new_lp[i];
    }
    std::vector<int64_t> still;
    for (int64_t n : active) {
      it[n] += 1;
      if (changed_first[n] >= 0) {
        first_dirty[n] = changed_first[n] + 1;
        still.push_back(n);
      }
    }
    active.swap(still);
  }
  return {tokens, logprobs, iters};
}

std::tuple<at::Tensor, at::Tensor> sequential_refine_cpu(const at::Tensor& ctx, const at::Tensor& prefix_tokens,
                                                         const at::Tensor& base_logits, XK_REFINE_WEIGHT_ARGS,
                                                         XK_SAMPLING_ARGS, const std::optional<at::Tensor>& errors,
                                                         std::string_view filter_order) {
  const auto [s, sampling, w, logits, fused] = prepare(ctx, prefix_tokens, "prefix_tokens", true, base_logits, emb, mix,
                                                       w_gate, w_up, w_down, w_read, XK_SAMPLING_FORWARD, errors,
                                                       filter_order);
  auto tokens = at::zeros({s.n, s.d}, prefix_tokens.options());
  auto logprobs = at::empty({s.n, s.d}, ctx.options());
  std::vector<int64_t> step_tok(static_cast<size_t>(s.n));
  std::vector<float> step_lp(static_cast<size_t>(s.n));
  auto tok = tokens.accessor<int64_t, 2>();
  auto lp = logprobs.accessor<float, 2>();
  for (int64_t slot = 0; slot < s.d; ++slot) {
    // Slot F+slot depends only on slots before it, which are decided.
    const auto prev = at::cat(std::vector<at::Tensor>{prefix_tokens, tokens.narrow(1, 0, s.d - 1)}, 1);
    const auto z = hidden_states(ctx, prev, w).select(1, s.f + slot);
    Rows rows;
    for (int64_t n = 0; n < s.n; ++n) rows.emplace_back(n, slot);
    sample_rows(logits, rows, z, w.w_read, sampling, fused, step_tok.data(), step_lp.data());
    for (int64_t n = 0; n < s.n; ++n) tok[n][slot] = step_tok[n], lp[n][slot] = step_lp[n];
  }
  return {tokens, logprobs};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) {
  m.impl("refine_step", &refine_step_cpu);
  m.impl("jacobi_refine", &jacobi_refine_cpu);
  m.impl("sequential_refine", &sequential_refine_cpu);
}

}  // namespace xkernels
