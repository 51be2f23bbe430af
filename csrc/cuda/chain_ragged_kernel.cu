// chain_verify_ragged_ on CUDA:
//  0. filtered rows (candidates.cuh): a block per (row, slice) reads its slice once and keeps its
//     argmax and best ids; unfiltered rows (greedy, plain sampling): a block per (row, slice) sums
//     its slice's statistics. Then a block per row merges them: a filtered row's cut and kept sum
//     from its candidates, into the row's state, where they settle it (nearly every row of a
//     trained model; min-p alone where its floor lies above every dropped key); an unfiltered
//     row's statistics, its slices' in slice order.
//  1. rows: a block per (request, row) prepares every row the slices did not settle at once: a pass
//     for its statistics; a filtered row then finds its cut (row_filter.cuh: radix selection,
//     usually 1 more pass), which also gives the kept ids' sum (a pass of its own, of fixed-point
//     masses, only for min-p alone). The rows' states go to the workspace.
//  2. residuals (block verification with draft probabilities): a block per drafted row computes
//     its prefix weight from the prepared rows before it and its residual mass Z_i (a pass over the
//     row and its q), every row at once.
//  3. walk: a block per request walks its rows in order on those states (token-wise: up to the
//     first rejection; block verification: every drafted row), reading a row again only for the
//     sample of the row it stops at.
// Rows past a token-wise rejection are prepared too (the batch's floor reads every row once); the
// walk no longer waits on any row's statistics. Draft ids outside [0, V) and
// any values of cu_num_draft_tokens or of the per-row parameters stay memory-safe: ids count as
// rejected, counts are clamped into [0, T] and max_spec_len, invalid parameters read as off (greedy
// for a temperature) and, given an errors buffer, are flagged in it by the walk.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "candidates.cuh"
#include "chain_ragged_launch.h"
#include "device_utils.cuh"
#include "draft_probs.cuh"
#include "row_filter.cuh"
#include "xkernels/param_errors.h"
#include "xkernels/sampling.h"
#include "xkernels/sampling_params.h"

namespace xkernels::cuda {
namespace {

struct RowState {
  RowStats s;  // of the filtered row
  FilterCut cut;  // all three filters
  bool point_mass;
  int32_t kept_n = -1;  // select settled the row: its kept ids, ranked in the row's candidate slot

  __device__ __forceinline__ bool keeps(float a, int64_t v) const {
    return filter_keeps(cut, a, static_cast<int32_t>(v));
  }
  __device__ __forceinline__ float prob(float a, int64_t v) const {
    if (point_mass) return v == s.top.idx ? 1.0f : 0.0f;
    return keeps(a, v) ? stats_prob(s, a) : 0.0f;
  }
  __device__ __forceinline__ float logprob(float a) const {
    return point_mass ? 0.0f : a - s.top.val - log_f32(s.sum);
  }
};

// What prepare works in: the cut's shared memory and the row's state.
struct RowShared {
  CutShared cut;
  RowState row;
};

// What the walk's block shares.
struct Shared {
  RowState row;  // of the row the walk stands on
  bool flag;
  int32_t exclude;
  ArgMax best;
};

// The statistics pass, a row's first read (from HBM): where the row starts 16-byte aligned, chunks
// of 16 bytes, kStatsChunks in flight a thread (64 KB for the rows kernel's one block an SM: at two
// blocks, 128 registers, the selection spilled); else kStatsScale times kIdDepth ids at once.
constexpr int kStatsChunks = 16;
constexpr int kStatsScale = 2;

// Row i's statistics and, with filters, its cut and the kept ids' sum, into sh.row.
template <typename T>
__device__ void prepare(RowShared& sh, const RowView<T>& r, const RowSampling& rs, bool greedy, bool filtered,
                        int mass_shift) {
  const TopBits bits = filtered ? top_bits(rs, r.v) : TopBits::kNone;
  if (bits != TopBits::kNone) clear_top_bits(sh.cut);
  __syncthreads();
  RowStats local = stats_empty();
  if (reinterpret_cast<uintptr_t>(r.row) % 16 == 0) {
    constexpr int kIds = 16 / sizeof(T);
    XK_ROW_PASS();
    local = thread_row_stats<T, false, kStatsChunks>(r.row, r.v, 0, (r.v + kIds - 1) / kIds, true, r.scale, r.exclude,
                                                     threadIdx.x, kThreads,
                                                     [&](float a) { observe_top_bits(sh.cut, a, bits); });
  } else {
    r.template for_each_in_order<kStatsScale>([&](int64_t i, float a) {
      stats_observe(local, a, static_cast<int32_t>(i));
      observe_top_bits(sh.cut, a, bits);
    });
  }
  local = block_merge(local, stats_empty());
  if (threadIdx.x == 0) sh.row = RowState{local, keep_all(), greedy || stats_degenerate(local)};
  __syncthreads();
  if (!filtered || sh.row.point_mass) return;
  const float top = sh.row.s.top.val;
  unsigned long long kept;
  const FilterCut cut = filter_cut(sh.cut, r, top, rs, mass_shift, &kept);
  const float sum = kept_sum(r, cut, top, kept, mass_shift);
  if (threadIdx.x == 0) sh.row = RowState{RowStats{sh.row.s.top, sum}, cut, false};
  __syncthreads();
}

// The block's draw from its threads' best scores (the row's argmax when nothing could be drawn).
__device__ int32_t block_pick(Shared& sh, ArgMax best, const RowState& row) {
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) sh.best = best;
  __syncthreads();
  const ArgMax merged = sh.best;
  __syncthreads();  // sh.best is read before anyone can write it again
  return merged.val == kNegInf ? row.s.top.idx : merged.idx;
}

// The token drawn at the prepared row: the argmax at a point mass; else a Gumbel-max over p'
// without `exclude`, or (q_row set) over max(p' - q * q_scale, 0). Without q, a row select
// settled draws from its kept ids (`kept`, from L2) instead of a pass: the same scores
// (gumbel_group's skips never drop a winner). With q a pass still runs: a q outside [0, 1] could
// give a dropped id a positive residual.
template <typename T>
__device__ int32_t sample_row(Shared& sh, const RowView<T>& r, const RowStream& st, uint32_t slot, int32_t exclude,
                              ProbsPtr q_row, float q_scale, const Candidate* kept) {
  const RowState row = sh.row;
  if (row.point_mass) return row.s.top.idx;
  const uint64_t offset = st.offset_at(slot);
  const uint32_t sequence = st.sequence_at(), position = st.position_at(slot);
  ArgMax best = argmax_empty();
  if (row.kept_n >= 0 && !q_row) {
    for (int e = threadIdx.x; e < row.kept_n; e += kThreads) {
      const Candidate c = kept[e];
      if (c.id != exclude) best = argmax_merge(best, gumbel_score(key_value(c.key), c.id, st.seed, offset, sequence, position));
    }
    return block_pick(sh, best, row);
  }
  // A thread's groups of 4 ids as a plain loop takes them (the ids of a draw are grouped by 4),
  // kIdDepth ids (and q's) loaded at once.
  struct Group {
    T x[4];
    float q[4];
  };
  const auto load = [&](int64_t g) {
    Group l{};
    for (int j = 0; j < 4; ++j) {
      const int64_t id = 4 * g + j;
      if (id < r.v) {
        l.x[j] = r.row[id];
        if (q_row) l.q[j] = q_row[id];
      }
    }
    return l;
  };
  XK_ROW_PASS();
  for_each_batched<kIdDepth / 4>(threadIdx.x, (r.v + 3) / 4, kThreads, load, [&](int64_t g, const Group& l) {
    const int count = static_cast<int>(r.v - 4 * g < 4 ? r.v - 4 * g : 4);
    float w[4];
    if (q_row) {
      for (int j = 0; j < 4; ++j) {
        const int64_t id = 4 * g + j;
        w[j] = j < count ? row.prob(r.value(id, l.x[j]), id) - l.q[j] * q_scale : 0.0f;
      }
      linear_group(best, st.seed, offset, sequence, position, static_cast<uint32_t>(g), w);
    } else {
      for (int j = 0; j < 4; ++j) {
        const int64_t id = 4 * g + j;
        const float a = j < count ? r.value(id, l.x[j]) : kNegInf;
        w[j] = j < count && id != exclude && row.keeps(a, id) ? a : kNegInf;
      }
      gumbel_group(best, st.seed, offset, sequence, position, static_cast<uint32_t>(g), w, count);
    }
  });
  return block_pick(sh, best, row);
}


// The draft's scaled logit at row view r in state `row`, -inf where the filters drop it.
template <typename T>
__device__ __forceinline__ float filtered_logit(const RowState& row, const RowView<T>& r, int64_t x) {
  const float a = r.a(x);
  return row.point_mass || row.keeps(a, x) ? a : kNegInf;
}

// Block verification's prefix weight after draft x of row r (block_weight of p'(x) and q(x); q_row
// null: a deterministic proposal).
template <typename T>
__device__ __forceinline__ float weight_after(float w, const RowState& row, const RowView<T>& r, int64_t x, bool valid,
                                              ProbsPtr q_row) {
  const float p_x = valid ? row.prob(filtered_logit(row, r, x), x) : 0.0f;
  return block_weight(w, p_x, q_row ? (valid ? q_row[x] : 0.0f) : 1.0f);
}

// Z = sum_v max(w p'(v) - q(v), 0) over row r in state `row`, at thread 0 of the block.
template <typename T>
__device__ float residual_sum(const RowState& row, const RowView<T>& r, ProbsPtr q_row, float w) {
  float z = 0.0f;
  r.for_each_in_order([&](int64_t v) { return q_row[v]; },
                      [&](int64_t v, float a, float q_v) {
                        const float d = w * row.prob(a, v) - q_v;
                        if (d > 0.0f) z += d;
                      });
  return block_sum(z);
}

struct Request {
  int64_t lo, k;  // first draft, drafts
  RowSampling rs;
  RowStream st;
  bool greedy, filtered;
};

template <typename T>
class RequestWalk {
 public:
  // states: the request's prepared rows; residuals: its rows' Z (block verification with draft
  // probabilities).
  // kept: the request's rows' candidate slots (kept_stride apart), where select ranked a settled
  // row's kept ids.
  __device__ RequestWalk(const T* logits, const int64_t* draft, ProbsPtr q, int64_t v, int32_t* out,
                         float* logprobs, const Request& req, const RowState* states, const float* residuals,
                         const Candidate* kept, int64_t kept_stride, Shared& sh)
      : req_(req), sh_(sh), states_(states), residuals_(residuals), kept_(kept), kept_stride_(kept_stride), v_(v),
        rows_(logits + (req.lo + blockIdx.x) * v), draft_(draft + req.lo), q_(q + req.lo * v), out_(out),
        logprobs_(logprobs) {}

  __device__ int64_t token_wise() {
    int64_t i = 0;
    for (;; ++i) {
      stand_on(i);
      if (i == req_.k) break;
      if (threadIdx.x == 0) {
        const int64_t x = draft_[i];
        const bool valid = x >= 0 && x < v_;
        const RowState& row = sh_.row;
        const float a_x = valid ? filtered_logit(row, view(i), x) : kNegInf;
        const ProbsPtr q_row = q(i);
        const bool accepted =
            valid && draft_accepted(row.point_mass, static_cast<int32_t>(x), row.s, a_x, static_cast<bool>(q_row),
                                    q_row ? q_row[x] : 0.0f, row.point_mass ? 0.0f : req_.st.coin(static_cast<uint32_t>(i)));
        sh_.flag = accepted;
        sh_.exclude = valid ? static_cast<int32_t>(x) : -1;
        if (accepted) emit(i, x, [&] { return row.logprob(a_x); });
      }
      __syncthreads();
      if (!sh_.flag) break;
    }
    const bool bonus = i == req_.k;
    const int32_t exclude = bonus ? -1 : sh_.exclude;
    const int32_t token =
        sample_row(sh_, view(i), req_.st, static_cast<uint32_t>(i), exclude, bonus ? ProbsPtr{} : q(i), 1.0f, kept(i));
    if (threadIdx.x == 0) emit(i, token, [&] { return sh_.row.logprob(view(i).a(token)); });
    return i + 1;
  }

  // Block verification (xkernels/sampling_params.h): tau is the last i whose coin (of row i - 1)
  // is below h_i; the weights and decisions are thread 0's, the passes the block's.
  __device__ int64_t block_wise() {
    float w = 1.0f, w_tau = 1.0f;
    int64_t tau = 0;
    for (int64_t i = 0; i < req_.k; ++i) {
      stand_on(i);
      const int64_t x = draft_[i];
      const bool valid = x >= 0 && x < v_;
      if (i > 0) {
        const float z = residual_mass(i, x, valid, w);
        if (req_.st.coin(static_cast<uint32_t>(i - 1)) < block_threshold(z, w)) {
          tau = i;
          w_tau = w;
        }
      }
      if (threadIdx.x == 0)
        emit(i, x, [&] { return sh_.row.logprob(valid ? filtered_logit(sh_.row, view(i), x) : kNegInf); });
      w = weight_after(w, sh_.row, view(i), x, valid, q(i));
      __syncthreads();  // sh.row is read before the next row's state replaces it
    }
    if (req_.k > 0 && req_.st.coin(static_cast<uint32_t>(req_.k - 1)) < w) {
      tau = req_.k;
      w_tau = w;
    }
    stand_on(tau);
    const bool bonus = tau == req_.k;
    int32_t exclude = -1;
    if (!bonus) {
      const int64_t x = draft_[tau];
      exclude = x >= 0 && x < v_ ? static_cast<int32_t>(x) : -1;
    }
    const int32_t token = sample_row(sh_, view(tau), req_.st, static_cast<uint32_t>(tau), exclude,
                                     bonus ? ProbsPtr{} : q(tau), 1.0f / w_tau, kept(tau));
    if (threadIdx.x == 0) emit(tau, token, [&] { return sh_.row.logprob(view(tau).a(token)); });
    return tau + 1;
  }

 private:
  // Row i's prepared state into sh.row, for the whole block.
  __device__ void stand_on(int64_t i) {
    if (threadIdx.x == 0) sh_.row = states_[i];
    __syncthreads();
  }
  __device__ RowView<T> view(int64_t i) const {
    return RowView<T>{rows_ + i * v_, v_, req_.greedy ? 1.0f : req_.rs.inv_t};
  }
  __device__ ProbsPtr q(int64_t i) const { return q_ + i * v_; }
  __device__ const Candidate* kept(int64_t i) const { return kept_ + i * kept_stride_; }
  // Token i and, when asked for (logprobs_ set), its log-probability: logprob() runs only then.
  template <typename F>
  __device__ void emit(int64_t i, int64_t token, F&& logprob) const {
    out_[i] = static_cast<int32_t>(token);
    if (logprobs_) logprobs_[i] = logprob();
  }

  // Z = sum_v max(w p'(v) - q(v), 0) at row i, the walk's: closed form without draft probabilities
  // (q = one-hot(x)), else the residual kernel's.
  __device__ float residual_mass(int64_t i, int64_t x, bool valid, float w) const {
    if (!q_) return w * (1.0f - (valid ? sh_.row.prob(filtered_logit(sh_.row, view(i), x), x) : 0.0f));
    return residuals_[i];
  }

  const Request req_;
  Shared& sh_;
  const RowState* states_;
  const float* residuals_;
  const Candidate* kept_;
  const int64_t kept_stride_;
  const int64_t v_;
  const T* rows_;
  const int64_t* draft_;
  const ProbsPtr q_;
  int32_t* out_;
  float* logprobs_;
};

__device__ int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : (x > hi ? hi : x); }

// Request n's drafts (the counts clamped into [0, T] and max_spec_len), parameters and stream.
__device__ Request request_of(const ChainRaggedParams& p, int64_t n) {
  Request req;
  req.lo = n == 0 ? 0 : clamp64(p.cu[n - 1], 0, p.t);
  const int64_t hi = clamp64(p.cu[n], req.lo, p.t);
  req.k = hi - req.lo < p.max_spec_len ? hi - req.lo : p.max_spec_len;
  req.rs = p.s.row(n);
  req.st = p.s.stream(n);
  req.greedy = req.rs.inv_t == 0.0f;
  req.filtered = !req.greedy && filters_active(req.rs, p.v);
  return req;
}

// Launch 0a: block (row, slice) of a filtered row scans its slice (unfiltered rows, rows past a
// request's drafts and rows of the other kWithTotal exit; a launch for each).
template <typename T, bool kWithTotal>
__global__ void __launch_bounds__(kThreads, 4) chain_ragged_scan_kernel(ChainRaggedParams p, CandidateSpace c) {
  __shared__ ScanShared sh;
  const int64_t width = p.max_spec_len + 1;
  const int64_t row = blockIdx.x / c.layout.slices, slice = blockIdx.x % c.layout.slices;
  const int64_t n = row / width, i = row % width;
  const Request req = request_of(p, n);
  if (!req.filtered || i > req.k || select_needs_total(req.rs, p.v) != kWithTotal) return;  // the whole block
  const RowView<T> r{static_cast<const T*>(p.logits) + (req.lo + n + i) * p.v, p.v, req.rs.inv_t};
  const int64_t begin = slice * c.layout.chunks;
  scan_slice<T, kWithTotal>(sh, r, begin, begin + c.layout.chunks, c.sums + blockIdx.x,
                            c.cands + static_cast<int64_t>(blockIdx.x) * kSliceKeep);
}

// Launch 0c: block (row, slice) of an unfiltered row sums its slice's statistics (the scaled row,
// as prepare's pass: x / T, x at T = 0), 16-byte loads kScanDepth in flight a thread where the row
// starts aligned, into slice_stats[blockIdx.x] (filtered rows and rows past a request's drafts exit).
template <typename T>
__global__ void __launch_bounds__(kThreads, 4) chain_ragged_stats_kernel(ChainRaggedParams p, SliceLayout layout,
                                                                         RowStats* slice_stats) {
  const int64_t width = p.max_spec_len + 1;
  const int64_t row = blockIdx.x / layout.slices, slice = blockIdx.x % layout.slices;
  const int64_t n = row / width, i = row % width;
  const Request req = request_of(p, n);
  if (req.filtered || i > req.k) return;  // the whole block
  if (slice == 0) XK_ROW_PASS();  // the emulation counts a read of the row where its first slice reads
  const T* src = static_cast<const T*>(p.logits) + (req.lo + n + i) * p.v;
  const int64_t begin = slice * layout.chunks;
  const RowStats s =
      thread_row_stats<T, false, kScanDepth>(src, p.v, begin, begin + layout.chunks,
                                             reinterpret_cast<uintptr_t>(src) % 16 == 0,
                                             req.greedy ? 1.0f : req.rs.inv_t, -1, threadIdx.x, kThreads);
  const RowStats merged = block_merge(s, stats_empty());
  if (threadIdx.x == 0) slice_stats[blockIdx.x] = merged;
}

// Launch 0b: a block per row notes whether it settles the row's state: a filtered row's cut from
// its slices' candidates, where they settle it; an unfiltered row's statistics, its slices' merged
// in slice order (always).
__global__ void __launch_bounds__(kThreads) chain_ragged_select_kernel(ChainRaggedParams p, CandidateSpace c,
                                                                       const RowStats* slice_stats, RowState* states,
                                                                       int mass_shift) {
  __shared__ SelectShared sh;
  const int64_t width = p.max_spec_len + 1;
  const int64_t row = blockIdx.x, n = row / width, i = row % width;
  const Request req = request_of(p, n);
  if (i > req.k) return;  // the whole block
  const int64_t first = row * c.layout.slices;
  if (!req.filtered) {  // the whole block
    const RowStats mine = static_cast<int>(threadIdx.x) < c.layout.slices ? slice_stats[first + threadIdx.x] : stats_empty();
    const RowStats merged = block_merge(mine, stats_empty());
    if (threadIdx.x == 0) {
      states[row] = RowState{merged, keep_all(), req.greedy || stats_degenerate(merged)};
      c.settled[row] = 1;
    }
    return;
  }
  RowCut cut;
  const bool settled = select_cut(sh, c.sums + first, c.cands + first * kSliceKeep, c.layout.slices, req.rs, p.v,
                                  mass_shift, &cut);
  // the kept ids, for the walk's draw, over the slot's candidates (select has read them)
  const int kept = settled && !cut.degenerate ? select_keep(sh, c.layout.slices, cut.cut, c.cands + first * kSliceKeep) : -1;
  if (threadIdx.x != 0) return;
  c.settled[row] = settled;
  if (!settled) return;
  states[row] = cut.degenerate ? RowState{RowStats{cut.top, 0.0f}, keep_all(), true}
                               : RowState{RowStats{cut.top, fixed_sum_value(cut.kept, mass_shift)}, cut.cut, false, kept};
}

// Launch 1: block (n, i) prepares row i of request n (those past its drafts, and the rows select
// settled, exit), into states[n * (max_spec_len + 1) + i]. One block an SM: the selection takes the
// registers.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) chain_ragged_rows_kernel(ChainRaggedParams p, RowState* states,
                                                                         const int32_t* settled, int mass_shift) {
  __shared__ RowShared sh;
  const int64_t width = p.max_spec_len + 1;
  const int64_t n = blockIdx.x / width, i = blockIdx.x % width;
  const Request req = request_of(p, n);
  if (i > req.k || settled[blockIdx.x]) return;  // the whole block
  const RowView<T> r{static_cast<const T*>(p.logits) + (req.lo + n + i) * p.v, p.v, req.greedy ? 1.0f : req.rs.inv_t};
  prepare(sh, r, req.rs, req.greedy, req.filtered, mass_shift);
  if (threadIdx.x == 0) states[blockIdx.x] = sh.row;
}

// Launch 2, block verification with draft probabilities only: block (n, i), 0 < i < K_n, computes
// the prefix weight w_i from the prepared rows before it (thread 0, the walk's float operations in
// its order) and row i's Z_i = sum_v max(w_i p'_i(v) - q_i(v), 0), the walk's residual, into
// residuals[n * (max_spec_len + 1) + i]: every row's pass at once instead of one after another in
// the walk.
template <typename T>
__global__ void __launch_bounds__(kThreads) chain_ragged_residual_kernel(ChainRaggedParams p, const RowState* states,
                                                                         float* residuals) {
  __shared__ float weight;
  const int64_t width = p.max_spec_len + 1;
  const int64_t n = blockIdx.x / width, i = blockIdx.x % width;
  const Request req = request_of(p, n);
  if (req.greedy || i < 1 || i >= req.k) return;  // the whole block; greedy requests walk token-wise
  const T* rows = static_cast<const T*>(p.logits) + (req.lo + n) * p.v;
  const auto view = [&](int64_t j) { return RowView<T>{rows + j * p.v, p.v, req.rs.inv_t}; };
  const ProbsPtr q = ProbsPtr{p.q, p.q_dtype} + req.lo * p.v;
  if (threadIdx.x == 0) {
    float w = 1.0f;
    for (int64_t j = 0; j < i; ++j) {
      const int64_t x = p.draft[req.lo + j];
      w = weight_after(w, states[n * width + j], view(j), x, x >= 0 && x < p.v, q + j * p.v);
    }
    weight = w;
  }
  __syncthreads();
  const RowState row = states[n * width + i];
  const float z = residual_sum(row, view(i), q + i * p.v, weight);
  if (threadIdx.x == 0) residuals[blockIdx.x] = z;
}

// Launch 3: a block per request walks its prepared rows.
template <typename T>
__global__ void __launch_bounds__(kThreads) chain_ragged_kernel(ChainRaggedParams p, const RowState* states,
                                                                const float* residuals, CandidateSpace c) {
  __shared__ Shared sh;
  const int64_t n = blockIdx.x;
  const Request req = request_of(p, n);
  const int64_t width = p.max_spec_len + 1;
  RequestWalk<T> walk(static_cast<const T*>(p.logits), p.draft, ProbsPtr{p.q, p.q_dtype}, p.v, p.out + n * width,
                      p.logprobs ? p.logprobs + n * width : nullptr,
                      req, states + n * width, residuals + n * width,
                      c.cands + n * width * c.layout.slices * kSliceKeep, c.layout.slices * kSliceKeep, sh);
  const int64_t emitted = p.block && !req.greedy ? walk.block_wise() : walk.token_wise();
  __syncthreads();  // thread 0's writes of the emitted slots come before the padding
  for (int64_t j = emitted + threadIdx.x; j < width; j += kThreads) {
    p.out[n * width + j] = -1;
    if (p.logprobs) p.logprobs[n * width + j] = __uint_as_float(0x7FC00000u);
  }
  if (threadIdx.x == 0) {
    p.num_emitted[n] = static_cast<int32_t>(emitted);
    if (p.errors) p.errors[n] |= row_param_errors(p.s, n);  // this block is the word's only writer
  }
}

int64_t row_count(const ChainRaggedParams& p) { return p.n * (p.max_spec_len + 1); }

SliceLayout layout_of(const ChainRaggedParams& p) {
  return slice_layout(p.v, p.dtype == LogitsType::kFloat32 ? 4 : 8);
}

// The workspace: every row's state, its Z (block verification with draft probabilities), then the
// slices': whether select settled the row, the slices' summaries, statistics and candidates.
struct Workspace {
  size_t states, residuals, settled, sums, stats, cands;  // byte offsets
  size_t bytes;
};

Workspace workspace_of(const ChainRaggedParams& p) {
  const auto rows = static_cast<size_t>(row_count(p));
  const auto slices = rows * static_cast<size_t>(layout_of(p).slices);
  Workspace w{};
  w.residuals = align_up(sizeof(RowState) * rows);
  w.settled = w.residuals + (p.block && p.q ? align_up(sizeof(float) * rows) : 0);
  w.sums = w.settled + align_up(sizeof(int32_t) * rows);
  w.stats = w.sums + align_up(sizeof(SliceSummary) * slices);
  w.cands = w.stats + align_up(sizeof(RowStats) * slices);
  w.bytes = w.cands + sizeof(Candidate) * kSliceKeep * slices;
  return w;
}

template <typename T>
cudaError_t launch_typed(const ChainRaggedParams& p, void* workspace, cudaStream_t stream) {
  char* base = static_cast<char*>(workspace);
  const Workspace w = workspace_of(p);
  auto* states = reinterpret_cast<RowState*>(base + w.states);
  auto* residuals = reinterpret_cast<float*>(base + w.residuals);
  auto* slice_stats = reinterpret_cast<RowStats*>(base + w.stats);
  const CandidateSpace c{layout_of(p), reinterpret_cast<SliceSummary*>(base + w.sums),
                         reinterpret_cast<Candidate*>(base + w.cands), reinterpret_cast<int32_t*>(base + w.settled)};
  const auto rows = static_cast<unsigned>(row_count(p));
  const int shift = cut_mass_shift(p.v);
  const unsigned blocks = rows * static_cast<unsigned>(c.layout.slices);
  chain_ragged_scan_kernel<T, false><<<blocks, kThreads, 0, stream>>>(p, c);
  chain_ragged_scan_kernel<T, true><<<blocks, kThreads, 0, stream>>>(p, c);
  chain_ragged_stats_kernel<T><<<blocks, kThreads, 0, stream>>>(p, c.layout, slice_stats);
  chain_ragged_select_kernel<<<rows, kThreads, 0, stream>>>(p, c, slice_stats, states, shift);
  chain_ragged_rows_kernel<T><<<rows, kThreads, 0, stream>>>(p, states, c.settled, shift);
  if (p.block && p.q) chain_ragged_residual_kernel<T><<<rows, kThreads, 0, stream>>>(p, states, residuals);
  chain_ragged_kernel<T><<<static_cast<unsigned>(p.n), kThreads, 0, stream>>>(p, states, residuals, c);
  return cudaGetLastError();
}

}  // namespace

size_t chain_ragged_workspace_bytes(const ChainRaggedParams& p) { return workspace_of(p).bytes; }

cudaError_t launch_chain_ragged(const ChainRaggedParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  if (row_count(p) * layout_of(p).slices > 0x7FFFFFFF) return cudaErrorInvalidValue;
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_typed<float>(p, workspace, stream);
    case LogitsType::kBFloat16: return launch_typed<__nv_bfloat16>(p, workspace, stream);
    case LogitsType::kFloat16: return launch_typed<__half>(p, workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xkernels::cuda
