// chain_verify on the CPU: sequences in parallel; each walks its rows in order
// and stops reading at the first rejection.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <memory>
#include <type_traits>

#include "../ops/checks.h"
#include "dispatch.h"
#include "row_reduce.h"
#include "xkernels/sampling.h"

namespace xkernels {
namespace {

struct ChainArgs {
  int64_t k, v;
  float inv_t;  // 0: greedy
  uint64_t seed, offset;
};

// float32 rows are read in place when greedy or at T = 1; others are converted and scaled once.
template <typename T>
bool reads_in_place(const ChainArgs& c) {
  return std::is_same_v<T, float> && (c.inv_t == 0.0f || c.inv_t == 1.0f);
}

// Verifies sequence n: writes its accept length and K+1 output tokens. buffer (unless rows are
// read in place) and residual (with q) hold V floats each.
template <typename T>
void verify_sequence(const ChainArgs& c, int64_t n, const T* logits, const int64_t* draft, const float* q,
                     int64_t* accept_len, int64_t* out, float* buffer, float* residual) {
  const bool greedy = c.inv_t == 0.0f;
  SampleJob job{kSampleDone, 0, -1, 0, stats_empty()};
  const float* a = nullptr;  // the scaled logits of row i
  int64_t i = 0;
  for (;; ++i) {
    if (reads_in_place<T>(c)) {
      a = reinterpret_cast<const float*>(logits) + i * c.v;
    } else {
      cpu::scale_row(logits + i * c.v, c.v, greedy ? 1.0f : c.inv_t, buffer);
      a = buffer;
    }
    const RowStats s = greedy ? RowStats{cpu::row_argmax(a, c.v), 0.0f} : cpu::row_stats(a, c.v);
    const bool point_mass = greedy || stats_degenerate(s);
    job = SampleJob{point_mass ? kSampleDone : kSamplePlain, static_cast<int32_t>(i), -1, s.top.idx, s};
    if (i == c.k) break;
    const int64_t x = draft[i];
    const bool valid = x >= 0 && x < c.v;
    const float* q_row = q ? q + i * c.v : nullptr;
    const bool accepted =
        valid && draft_accepted(point_mass, static_cast<int32_t>(x), s, a[x], q_row != nullptr,
                                q_row ? q_row[x] : 0.0f,
                                point_mass ? 0.0f : acceptance_coin(c.seed, c.offset, static_cast<uint32_t>(n), static_cast<uint32_t>(i)));
    if (!accepted) {
      if (!point_mass) {
        job.mode = q_row ? kSampleResidual : kSampleExclude;
        job.exclude = valid ? static_cast<int32_t>(x) : -1;
      }
      break;
    }
    out[i] = x;
  }
  int32_t token = job.fallback;
  if (job.mode != kSampleDone) {
    const auto sequence = static_cast<uint32_t>(n), row = static_cast<uint32_t>(job.row);
    ArgMax best;
    if (job.mode == kSampleResidual) {
      cpu::residual_row(a, q + i * c.v, c.v, job.stats.top.val, job.stats.sum, residual);
      best = cpu::sample_positive(c.seed, c.offset, sequence, row, residual, c.v);
    } else {
      best = cpu::sample_logits(c.seed, c.offset, sequence, row, a, c.v, job.mode == kSampleExclude ? job.exclude : -1);
    }
    token = sample_result(job, best);
  }
  *accept_len = i;
  out[i] = token;
  for (int64_t j = i + 1; j <= c.k; ++j) out[j] = -1;
}

std::tuple<at::Tensor, at::Tensor> chain_verify_cpu(const at::Tensor& draft_tokens, const at::Tensor& target_logits,
                                                    const std::optional<at::Tensor>& draft_probs, double temperature,
                                                    int64_t seed, int64_t offset,
                                                    const std::optional<at::Tensor>& seed_tensor,
                                                    const std::optional<at::Tensor>& offset_tensor) {
  const auto shape = check_chain_verify(draft_tokens, target_logits, draft_probs, temperature);
  check_token_ids(draft_tokens, shape.v, "draft_tokens");
  const RngArgs rng = rng_args(seed, offset, seed_tensor, offset_tensor, target_logits.device());
  const ChainArgs c{shape.k, shape.v, inverse_temperature(temperature),
                    rng.seed_ptr ? static_cast<uint64_t>(*rng.seed_ptr) : rng.seed,
                    rng.offset_ptr ? static_cast<uint64_t>(*rng.offset_ptr) : rng.offset};

  const auto logits = target_logits.contiguous();
  const auto draft = draft_tokens.contiguous();
  const auto q = draft_probs.has_value() ? draft_probs->contiguous() : at::Tensor();
  auto accept_len = at::empty({shape.n}, draft_tokens.options());
  auto out = at::empty({shape.n, shape.k + 1}, draft_tokens.options());
  if (shape.n == 0) return {accept_len, out};

  cpu::dispatch_logits(logits.scalar_type(), [&](auto tag) {
    const auto* l = logits.const_data_ptr<decltype(tag)>();
    const auto* d = draft.const_data_ptr<int64_t>();
    const float* qp = q.defined() ? q.const_data_ptr<float>() : nullptr;
    auto* acc = accept_len.mutable_data_ptr<int64_t>();
    auto* o = out.mutable_data_ptr<int64_t>();
    at::parallel_for(0, shape.n, 1, [&](int64_t begin, int64_t end) {
      using T = decltype(tag);
      // Left uninitialised: a zeroed V-float row would cost a pass (and page faults) per call.
      std::unique_ptr<float[]> row(reads_in_place<T>(c) ? nullptr : new float[shape.v]);
      std::unique_ptr<float[]> residual(qp ? new float[shape.v] : nullptr);
      for (int64_t n = begin; n < end; ++n)
        verify_sequence(c, n, l + n * (shape.k + 1) * shape.v, d + n * shape.k,
                        qp ? qp + n * shape.k * shape.v : nullptr, acc + n, o + n * (shape.k + 1), row.get(),
                        residual.get());
    });
  });
  return {accept_len, out};
}

}  // namespace

TORCH_LIBRARY_IMPL(xkernels, CPU, m) { m.impl("chain_verify", &chain_verify_cpu); }

}  // namespace xkernels
