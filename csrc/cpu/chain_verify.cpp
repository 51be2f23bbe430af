// chain_verify and chain_verify_ragged_ on the CPU: requests in parallel; each walks its rows in
// order, token-wise stopping at the first rejection, block-wise reading every drafted row.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <memory>
#include <type_traits>
#include <vector>

#include "../ops/chain_verify_ragged.h"
#include "../ops/checks.h"
#include "dispatch.h"
#include "draft_probs.h"
#include "row_reduce.h"
#include "top_filter.h"
#include "xkernels/param_errors.h"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels {
namespace {

// A thread's row buffers: the scaled (and filtered) row, the residual (with draft probabilities:
// the only case that reads it), a draft row converted to float (q not float32), the filter's
// scratch. Left uninitialised: a zeroed V-float row would cost a pass and page faults per call.
struct RowScratch {
  RowScratch(int64_t v, const cpu::DraftProbs& q)
      : a(new float[v]), residual(q ? new float[v] : nullptr), q(q.converts() ? new float[v] : nullptr) {}
  std::unique_ptr<float[]> a, residual, q;
  cpu::FilterScratch filter;
};

// One request: K drafts, its K + 1 target rows, optional draft probabilities [K, V].
template <typename T>
struct Request {
  int64_t k, v;
  const T* logits;
  const int64_t* draft;
  cpu::DraftProbs q;
};

// A prepared row: the scaled, filtered logits and their statistics; a point mass when greedy or
// when the row has no softmax.
struct Row {
  const float* a;
  RowStats s;
  bool point_mass;

  float prob(int64_t x) const { return point_mass ? (x == s.top.idx ? 1.0f : 0.0f) : stats_prob(s, a[x]); }
  float logprob(int64_t x) const { return point_mass ? 0.0f : a[x] - s.top.val - log_f32(s.sum); }
};

template <typename T>
class RequestVerifier {
 public:
  RequestVerifier(const Request<T>& r, const RowSampling& rs, const RowStream& st, RowScratch& scratch)
      : r_(r), rs_(rs), st_(st), scratch_(scratch), greedy_(rs.inv_t == 0.0f),
        filtered_(!greedy_ && filters_active(rs, r.v)),
        // float32 rows are read in place when nothing rescales or filters them.
        in_place_(std::is_same_v<T, float> && !filtered_ && (greedy_ || rs.inv_t == 1.0f)) {}

  // Writes the emitted tokens (and their log-probabilities) to out[0..], returns their count.
  int64_t token_wise(int64_t* out, float* logprobs) {
    int64_t i = 0;
    Row row;
    int32_t exclude = -1;
    bool residual = false;
    for (;; ++i) {
      row = prepare(i);
      if (i == r_.k) break;
      const int64_t x = r_.draft[i];
      const bool with_q = static_cast<bool>(r_.q);
      const bool accepted = draft_accepted(row.point_mass, static_cast<int32_t>(x), row.s, row.a[x], with_q,
                                           with_q ? r_.q.at(i, x) : 0.0f,
                                           row.point_mass ? 0.0f : st_.coin(static_cast<uint32_t>(i)));
      if (!accepted) {
        residual = with_q;
        exclude = static_cast<int32_t>(x);
        break;
      }
      emit(out, logprobs, i, x, row);
    }
    emit(out, logprobs, i, sample(i, row, i == r_.k ? -1 : exclude, residual, 1.0f), row);
    return i + 1;
  }

  // Block verification (xkernels/sampling_params.h): accepted length tau is the last i whose coin
  // (of row i - 1) is below h_i; every drafted row is read.
  int64_t block_wise(int64_t* out, float* logprobs) {
    float w = 1.0f, w_tau = 1.0f;
    int64_t tau = 0;
    for (int64_t i = 0; i < r_.k; ++i) {
      const Row row = prepare(i);
      const int64_t x = r_.draft[i];
      if (i > 0 && st_.coin(static_cast<uint32_t>(i - 1)) < block_threshold(residual_mass(row, i, x, w), w)) {
        tau = i;
        w_tau = w;
      }
      if (logprobs) logprobs[i] = row.logprob(x);
      out[i] = x;
      w = block_weight(w, row.prob(x), r_.q ? r_.q.at(i, x) : 1.0f);
    }
    if (r_.k > 0 && st_.coin(static_cast<uint32_t>(r_.k - 1)) < w) {
      tau = r_.k;
      w_tau = w;
    }
    const Row row = prepare(tau);
    const bool bonus = tau == r_.k;
    const int64_t token =
        sample(tau, row, bonus ? -1 : static_cast<int32_t>(r_.draft[tau]), !bonus && static_cast<bool>(r_.q), w_tau);
    emit(out, logprobs, tau, token, row);
    return tau + 1;
  }

 private:
  Row prepare(int64_t i) {
    const float* a;
    if (in_place_) {
      a = reinterpret_cast<const float*>(r_.logits) + i * r_.v;
    } else {
      cpu::scale_row(r_.logits + i * r_.v, r_.v, greedy_ ? 1.0f : rs_.inv_t, scratch_.a.get());
      a = scratch_.a.get();
    }
    RowStats s = greedy_ ? RowStats{cpu::row_argmax(a, r_.v), 0.0f} : cpu::row_stats(a, r_.v);
    const bool point_mass = greedy_ || stats_degenerate(s);
    if (filtered_ && !point_mass) s = cpu::filter_row(scratch_.a.get(), r_.v, s, rs_, scratch_.filter);
    return Row{a, s, point_mass};
  }

  // Z = sum_v max(w p'(v) - q(v), 0) at row i (q = one-hot(x) without draft probabilities).
  float residual_mass(const Row& row, int64_t i, int64_t x, float w) {
    if (!r_.q) return w * (1.0f - row.prob(x));
    if (!(w > 0.0f)) return 0.0f;  // sum of max(-q, 0)
    if (row.point_mass) {
      const float z = w - r_.q.at(i, row.s.top.idx);
      return z > 0.0f ? z : 0.0f;
    }
    float* e = scratch_.residual.get();
    cpu::exp_row(row.a, r_.v, row.s.top.val, e);
    const float* q_row = r_.q.row(i, scratch_.q.get());
    return static_cast<float>(cpu::residual_sum(e, q_row, r_.v, row.s.sum / w) * (w / row.s.sum));
  }

  // The token drawn at row i: the bonus (exclude -1, no residual) from p', the correction from p'
  // without `exclude`, or from normalize(max(w p' - q, 0)); the argmax at a point mass.
  int64_t sample(int64_t i, const Row& row, int32_t exclude, bool residual, float w) {
    if (row.point_mass) return row.s.top.idx;
    const auto slot = static_cast<uint32_t>(i);
    const uint64_t offset = st_.offset_at(slot);
    const uint32_t sequence = st_.sequence_at(), position = st_.position_at(slot);
    SampleJob job{kSamplePlain, static_cast<int32_t>(i), exclude, row.s.top.idx, row.s};
    ArgMax best;
    if (residual) {
      cpu::residual_row(row.a, r_.q.row(i, scratch_.q.get()), r_.v, row.s.top.val, row.s.sum, scratch_.residual.get(),
                        1.0f / w);
      best = cpu::sample_positive(st_.seed, offset, sequence, position, scratch_.residual.get(), r_.v);
    } else {
      best = cpu::sample_logits(st_.seed, offset, sequence, position, row.a, r_.v, exclude);
    }
    return sample_result(job, best);
  }

  static void emit(int64_t* out, float* logprobs, int64_t i, int64_t token, const Row& row) {
    out[i] = token;
    if (logprobs) logprobs[i] = row.logprob(token);
  }

  const Request<T>& r_;
  const RowSampling rs_;
  const RowStream st_;
  RowScratch& scratch_;
  const bool greedy_, filtered_, in_place_;
};

template <typename T>
int64_t verify_request(const Request<T>& r, const RowSampling& rs, const RowStream& st, bool block,
                       RowScratch& scratch, int64_t* out, float* logprobs) {
  RequestVerifier<T> verifier(r, rs, st, scratch);
  return block && rs.inv_t != 0.0f ? verifier.block_wise(out, logprobs) : verifier.token_wise(out, logprobs);
}

// Requests in parallel, each thread with its scratch, allocated once for its requests.
template <typename F>
void for_each_request(int64_t n, int64_t v, const cpu::DraftProbs& q, F&& f) {
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    RowScratch scratch(v, q);
    for (int64_t i = begin; i < end; ++i) f(i, scratch);
  });
}

std::tuple<at::Tensor, at::Tensor> chain_verify_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                                    const std::optional<at::Tensor>& draft_probs, double temperature,
                                                    int64_t seed, int64_t offset,
                                                    const std::optional<at::Tensor>& seed_tensor,
                                                    const std::optional<at::Tensor>& offset_tensor) {
  const auto shape = check_chain_verify(draft_tokens, target_logits, draft_probs, temperature);
  check_token_ids(draft_tokens, shape.v, "draft_tokens");
  const RngArgs rng = rng_args(seed, offset, seed_tensor, offset_tensor, target_logits.device());
  const RowSampling rs{inverse_temperature(temperature), 0, 1.0f, 0.0f};
  const uint64_t seed_v = rng.seed_ptr ? static_cast<uint64_t>(*rng.seed_ptr) : rng.seed;
  const uint64_t offset_v = rng.offset_ptr ? static_cast<uint64_t>(*rng.offset_ptr) : rng.offset;

  const auto logits = target_logits.contiguous();
  const auto draft = draft_tokens.contiguous();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  auto accept_len = at::empty({shape.n}, draft_tokens.options());
  auto out = at::empty({shape.n, shape.k + 1}, draft_tokens.options());
  if (shape.n == 0) return {accept_len, out};

  cpu::dispatch_logits(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const auto* l = logits.const_data_ptr<T>();
    const auto* d = draft.const_data_ptr<int64_t>();
    auto* acc = accept_len.mutable_data_ptr<int64_t>();
    auto* o = out.mutable_data_ptr<int64_t>();
    const int64_t k = shape.k, v = shape.v;
    const cpu::DraftProbs qp(q, v);
    for_each_request(shape.n, v, qp, [&](int64_t n, RowScratch& scratch) {
      const Request<T> r{k, v, l + n * (k + 1) * v, d + n * k, qp.rows_from(n * k)};
      const RowStream st{seed_v, offset_v, static_cast<uint32_t>(n), false};
      int64_t* row_out = o + n * (k + 1);
      const int64_t emitted = verify_request(r, rs, st, false, scratch, row_out, nullptr);
      acc[n] = emitted - 1;
      for (int64_t j = emitted; j <= k; ++j) row_out[j] = -1;
    });
  });
  return {accept_len, out};
}

void chain_verify_ragged_cpu(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft_tokens,
                             const at::Tensor& target_logits, int64_t max_spec_len,
                             const std::optional<at::Tensor>& draft_probs, XK_SAMPLING_ARGS, bool block,
                             const at::Tensor& output_token_ids, const at::Tensor& num_emitted,
                             const std::optional<at::Tensor>& logprobs, const std::optional<at::Tensor>& errors,
                             std::string_view filter_order) {
  const auto shape = check_chain_verify_ragged(draft_tokens, cu_num_draft_tokens, target_logits, max_spec_len,
                                               draft_probs, output_token_ids, num_emitted, logprobs, errors);
  // With errors the per-row values are flagged, not raised, as on CUDA.
  const SamplingArgs sampling =
      sampling_args(shape.n, target_logits.device(), XK_SAMPLING_FORWARD, filter_order, !errors.has_value());
  if (shape.n == 0) return;
  const auto logits = target_logits.contiguous();
  const auto draft = draft_tokens.to(at::kLong).contiguous();
  const auto cu = cu_num_draft_tokens.to(at::kLong).contiguous();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  const int64_t width = max_spec_len + 1, v = shape.v;

  cpu::dispatch_logits(logits.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const auto* l = logits.const_data_ptr<T>();
    const auto* d = draft.const_data_ptr<int64_t>();
    const auto* c = cu.const_data_ptr<int64_t>();
    auto* o = output_token_ids.mutable_data_ptr<int32_t>();
    auto* e = num_emitted.mutable_data_ptr<int32_t>();
    float* lp = logprobs.has_value() ? logprobs->mutable_data_ptr<float>() : nullptr;  // null: not computed
    int32_t* err = errors.has_value() ? errors->mutable_data_ptr<int32_t>() : nullptr;
    const SamplingView view = sampling_view(sampling);
    const cpu::DraftProbs qp(q, v);
    for_each_request(shape.n, v, qp, [&](int64_t n, RowScratch& scratch) {
      const int64_t start = n == 0 ? 0 : c[n - 1], k = c[n] - start;
      const Request<T> r{k, v, l + (start + n) * v, d + start, qp.rows_from(start)};
      std::vector<int64_t> tokens(k + 1);
      float* row_lp = lp ? lp + n * width : nullptr;
      const int64_t emitted = verify_request(r, view.row(n), view.stream(n), block, scratch,
                                             tokens.data(), row_lp);
      for (int64_t j = 0; j < width; ++j) o[n * width + j] = j < emitted ? static_cast<int32_t>(tokens[j]) : -1;
      for (int64_t j = emitted; row_lp && j < width; ++j) row_lp[j] = __builtin_nanf("");
      e[n] = static_cast<int32_t>(emitted);
      if (err) err[n] |= row_param_errors(view, n);
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) {
  m.impl("chain_verify", &chain_verify_cpu);
  m.impl("chain_verify_ragged_", &chain_verify_ragged_cpu);
}

}  // namespace xkernels
