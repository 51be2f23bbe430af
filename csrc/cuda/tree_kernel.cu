// The draft-tree ops on CUDA, one launch each, never waiting on the host:
//  build_draft_tree:    a warp per sequence stages its candidates in shared memory, then one lane
//                       runs the best-first search of xkernels/tree.h with the heap there too
//                       (global scratch instead when they do not fit in 48 KB: any budget works).
//  tree_attention_mask: a block per sequence stages the parents in shared memory and zeroes the
//  / tree_positions     mask, then a thread per node walks its ancestors, setting its own row
//                       (no two threads write one row).
//  tree_verify:         a block per sequence walks the tree; at each visited node the block
//                       reduces that one row's softmax statistics, thread 0 tests the children in
//                       order, and the block updates the residual when a rule needs the whole row.
//                       Only visited rows are read. At T > 0 two more launches draw the token at
//                       the stop node (Gumbel-max, each row split over many blocks) and merge.
//  compact_kv_:         a block per (sequence, head) moves the accepted entries in path order.
// Values the host cannot check without a sync (parents, num_nodes, token ids, path) are handled
// memory-safely: an invalid parent ends a walk, a child whose token lies outside [0, V) is never
// accepted, an invalid path stops the moves; XKERNELS_CHECK=1 makes the bindings raise instead.
#include "device_utils.cuh"
#include "row_reduce.cuh"
#include "tree_launch.h"
#include "xkernels/tree.h"

namespace xkernels::cuda {
namespace {

__device__ __forceinline__ int64_t node_count(const int64_t* num_nodes, int64_t n, int64_t m) {
  if (!num_nodes) return m;
  const int64_t c = num_nodes[n];
  return c < 1 ? 1 : c > m ? m : c;
}

constexpr size_t kBuildSmemLimit = 48 * 1024;

// Shared-memory bytes of one sequence's build: heap, log-probs, tokens (0: they do not fit).
size_t build_smem_bytes(const TreeBuildParams& p) {
  const size_t bytes = sizeof(TreeCandidate) * (p.budget + 1) + (sizeof(int64_t) + sizeof(float)) * p.d * p.k;
  return bytes <= kBuildSmemLimit ? bytes : 0;
}

__global__ void __launch_bounds__(32) build_tree_kernel(TreeBuildParams p, TreeCandidate* scratch, bool staged) {
  extern __shared__ __align__(16) uint8_t build_smem[];
  const int64_t n = blockIdx.x, m = p.budget + 1, slots = p.d * p.k;
  const float* lp = p.logprobs + n * slots;
  const int64_t* tok = p.tokens + n * slots;
  TreeCandidate* heap = nullptr;
  if (!staged) {
    heap = scratch + n * m;
  } else {  // heap, then tokens, then log-probs (the alignments in that order)
    heap = reinterpret_cast<TreeCandidate*>(build_smem);
    int64_t* tok_s = reinterpret_cast<int64_t*>(heap + m);
    float* lp_s = reinterpret_cast<float*>(tok_s + slots);
    for (int64_t i = threadIdx.x; i < slots; i += 32) tok_s[i] = tok[i], lp_s[i] = lp[i];
    __syncwarp();
    lp = lp_s, tok = tok_s;
  }
  if (threadIdx.x == 0)
    p.num_nodes[n] = build_tree(lp, tok, p.d, p.k, p.budget, heap, p.out_tokens + n * m, p.parents + n * m,
                                p.depth + n * m);
}

// Shared-memory bytes of tree_mask_kernel's staged parents (0: they do not fit; read from global).
size_t mask_smem_bytes(const TreeMaskParams& p) {
  const size_t bytes = sizeof(int32_t) * p.m;
  return bytes <= kBuildSmemLimit ? bytes : 0;
}

// The walks up the tree read each parent many times: staged in shared memory (as int32, an
// invalid parent as -1, so a value past 2^31 cannot alias a node) they cost tens of cycles a step
// instead of a global load's latency.
__global__ void __launch_bounds__(kThreads) tree_mask_kernel(TreeMaskParams p, bool staged) {
  extern __shared__ int32_t staged_parents[];
  const int64_t n = blockIdx.x;
  const int64_t count = node_count(p.num_nodes, n, p.m);
  const int64_t* parents = p.parents + n * p.m;
  // The parent of j, or -1 where the walk ends (an invalid parent).
  const auto valid_parent = [&](int64_t j) {
    const int64_t up = parents[j];
    return up < 0 || up >= j ? int64_t{-1} : up;
  };
  if (staged)
    for (int64_t j = threadIdx.x; j < p.m; j += kThreads) staged_parents[j] = static_cast<int32_t>(valid_parent(j));
  const int64_t row_bytes = p.packed ? (p.m + 7) / 8 : p.m;
  uint8_t* mask = p.mask ? p.mask + n * p.m * row_bytes : nullptr;
  if (mask)
    for (int64_t b = threadIdx.x; b < p.m * row_bytes; b += kThreads) mask[b] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < p.m; i += kThreads) {
    uint8_t* row = mask ? mask + i * row_bytes : nullptr;
    int64_t depth = 0;
    for (int64_t j = i;;) {
      if (row) {
        if (p.packed)
          row[j / 8] |= static_cast<uint8_t>(1u << (j % 8));
        else
          row[j] = 1;
      }
      if (j == 0 || i >= count) break;
      const int64_t up = staged ? staged_parents[j] : valid_parent(j);
      if (up < 0) break;  // an invalid parent ends the walk
      j = up;
      ++depth;
    }
    if (p.depth) p.depth[n * p.m + i] = depth;
  }
}

// The draw a sequence still needs where its walk stopped, left by tree_verify_kernel for the split
// sampling pass.
struct StopJob {
  int32_t node;  // the stop node, or -1: nothing to draw (the token is written)
  int32_t acc;   // accepted tokens: the draw goes to out_tokens[acc]
  int32_t nrej;  // tokens rejected at the node (w.rejected), or
  bool residual;  // draw from r instead
  int32_t top;   // the stop row's argmax: the token if nothing can be drawn
};

struct VerifyWorkspace {
  int32_t* kids;      // [n, m] the children of the node being tested
  int32_t* rejected;  // [n, m] tokens rejected at it (deterministic children)
  float* r;           // [n, v] the residual (draft_probs), or null
  float* qw;          // [n, v] q with removed tokens (without replacement), or null
  StopJob* jobs;      // [n]
  ArgMax* slices;     // [n, sample_slices]: each slice's Gumbel-max
  int sample_slices;
};

// What thread 0 decides and the block shares at one node.
struct NodeState {
  RowStats stats;
  int64_t chosen;
  int32_t kids, rejected, x;
  float zq, zr, remaining;
  bool residual, q_copied, empty;
};

template <typename T>
__device__ __forceinline__ float scaled(const T* row, int64_t x, float scale) {
  return to_float(row[x]) * scale;
}

// Four consecutive ids of a row as floats.
struct Four {
  float x[4];
};

// The Gumbel-max log-weights of ids 4g .. 4g+count-1 at the stop node: `a` holds the scaled
// logits, or the residual r when `residual`. Rejected tokens are looked up only when the group
// could still win (removing ids only lowers weights), so most groups skip the list.
__device__ __forceinline__ void stop_weights(const float (&a)[4], int64_t g, int count, bool residual,
                                             const int32_t* rejected, int32_t nrej, float best, float (&wt)[4]) {
  bool live = false;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    wt[j] = j >= count ? kNegInf : !residual ? a[j] : a[j] > 0.0f ? log_f32(a[j]) : kNegInf;
    live |= wt[j] + kGumbelBound >= best;
  }
  if (residual || !live) return;
  for (int32_t k = 0; k < nrej; ++k) {
    const int64_t x = rejected[k];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (4 * g + j == x) wt[j] = kNegInf;
  }
}

// vector_ok: rows of logits (and of q and r) start 16-byte aligned, so whole chunks load as vectors.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1) tree_verify_kernel(TreeVerifyParams p, VerifyWorkspace w,
                                                                   bool vector_ok) {
  constexpr int kIds = 16 / sizeof(T);
  __shared__ NodeState sh;
  const int64_t n = blockIdx.x, m = p.m, v = p.v;
  const int64_t count = node_count(p.num_nodes, n, m);
  const int64_t* tokens = p.tokens + n * m;
  const int64_t* parents = p.parents + n * m;
  int32_t* kids = w.kids + n * m;
  int32_t* rejected = w.rejected + n * m;
  float* r = w.r ? w.r + n * v : nullptr;
  float* qw = w.qw ? w.qw + n * v : nullptr;
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const bool greedy = p.inv_t == 0.0f;
  const float scale = greedy ? 1.0f : p.inv_t;
  int64_t node = 0, acc = 0;
  for (;;) {
    const T* row = static_cast<const T*>(p.logits) + (n * m + node) * v;
    // One block reads the row: 8 loads of 16 bytes in flight a thread (64 blocks then keep about
    // 2 MB in flight, what HBM needs for most of its bandwidth).
    const int64_t chunks = (v + kIds - 1) / kIds;
    RowStats s = greedy ? thread_row_stats<T, true, 8>(row, v, 0, chunks, vector_ok, 1.0f, -1, threadIdx.x, kThreads)
                        : thread_row_stats<T, false, 8>(row, v, 0, chunks, vector_ok, scale, -1, threadIdx.x, kThreads);
    s = block_merge(s, stats_empty());
    if (threadIdx.x == 0) {
      int32_t k = 0;
      for (int64_t c = node + 1; c < count; ++c)
        if (parents[c] == node) kids[k++] = static_cast<int32_t>(c);
      sh = NodeState{s, -1, k, 0, -1, 0.0f, 1.0f, 1.0f, false, false, false};
    }
    __syncthreads();
    s = sh.stats;
    const bool point_mass = greedy || stats_degenerate(s);
    const float* q_row = p.q ? p.q + (n * m + node) * v : nullptr;
    if (point_mass) {
      if (threadIdx.x == 0)
        for (int32_t i = 0; i < sh.kids && sh.chosen < 0; ++i)
          if (tokens[kids[i]] == s.top.idx) sh.chosen = kids[i];
    } else if (!q_row) {
      if (threadIdx.x == 0) {
        for (int32_t i = 0; i < sh.kids && sh.chosen < 0; ++i) {
          const int64_t x = tokens[kids[i]];
          if (x < 0 || x >= v) continue;
          bool seen = false;
          for (int32_t j = 0; j < sh.rejected; ++j) seen |= rejected[j] == x;
          if (seen) continue;  // r(x) = 0 already
          const float p_x = stats_prob(s, scaled(row, x, scale));
          if (tree_accept_plain(acceptance_coin(seed, offset, static_cast<uint32_t>(n), static_cast<uint32_t>(kids[i])),
                                p_x, sh.remaining)) {
            sh.chosen = kids[i];
          } else {
            rejected[sh.rejected++] = static_cast<int32_t>(x);
            sh.remaining -= p_x;
          }
        }
      }
    } else if (sh.kids > 0) {
      // Rows of q and r: four ids a 16-byte load, four loads in flight, when vector_ok.
      const int64_t quads = vector_ok ? v / 4 : 0;
      float zq = 0.0f;
      for_each_batched<4>(
          threadIdx.x, quads, kThreads, [&](int64_t g) { return reinterpret_cast<const float4*>(q_row)[g]; },
          [&](int64_t, const float4& x) { zq += (x.x + x.y) + (x.z + x.w); });
      for (int64_t x = 4 * quads + threadIdx.x; x < v; x += kThreads) zq += q_row[x];
      zq = block_sum(zq);
      if (threadIdx.x == 0) sh.zq = zq;
      for (int32_t i = 0; i < sh.kids; ++i) {
        __syncthreads();
        if (threadIdx.x == 0) {
          const int64_t x = tokens[kids[i]];
          sh.x = x >= 0 && x < v ? static_cast<int32_t>(x) : -1;
          if (sh.x >= 0) {
            const float* qs = sh.q_copied ? qw : q_row;
            const float r_x = sh.residual ? r[x] : stats_prob(s, scaled(row, x, scale));
            if (tree_accept_sampled(acceptance_coin(seed, offset, static_cast<uint32_t>(n), static_cast<uint32_t>(kids[i])),
                                    qs[x], sh.zq, r_x, sh.zr))
              sh.chosen = kids[i];
          }
        }
        __syncthreads();
        if (sh.chosen >= 0 || sh.x < 0) {
          if (sh.chosen >= 0) break;
          continue;  // a token outside [0, V): never accepted, no residual step
        }
        // Rejected: r <- max(r / zr - q / zq, 0), over the whole row.
        const float* qs = sh.q_copied ? qw : q_row;
        const float zr = sh.zr, zq_now = sh.zq;
        const bool residual = sh.residual;
        float total = 0.0f;
        // The new r of one id from its old value (r, or p = softmax at the first rejection) and q.
        const auto update = [&](float before, float qx) {
          const float rx = tree_residual(before, zr, qx, zq_now);
          total += rx;
          return rx;
        };
        struct Eight {
          Four a, q;
        };
        for_each_batched<4>(
            threadIdx.x, quads, kThreads,
            [&](int64_t g) {
              Eight e;
              if (residual)
                unpack<float>(reinterpret_cast<const float4*>(r)[g], 1.0f, e.a.x);
              else
                unpack<T>(reinterpret_cast<const typename Quad<T>::type*>(row)[g], scale, e.a.x);
              unpack<float>(reinterpret_cast<const float4*>(qs)[g], 1.0f, e.q.x);
              return e;
            },
            [&](int64_t g, const Eight& e) {
              float o[4];
#pragma unroll
              for (int j = 0; j < 4; ++j) o[j] = update(residual ? e.a.x[j] : stats_prob(s, e.a.x[j]), e.q.x[j]);
              reinterpret_cast<float4*>(r)[g] = float4{o[0], o[1], o[2], o[3]};
            });
        for (int64_t x = 4 * quads + threadIdx.x; x < v; x += kThreads)
          r[x] = update(residual ? r[x] : stats_prob(s, scaled(row, x, scale)), qs[x]);
        if (p.without_replacement && !sh.q_copied) {
          for (int64_t g = threadIdx.x; g < quads; g += kThreads)
            reinterpret_cast<float4*>(qw)[g] = reinterpret_cast<const float4*>(q_row)[g];
          for (int64_t x = 4 * quads + threadIdx.x; x < v; x += kThreads) qw[x] = q_row[x];
        }
        total = block_sum(total);
        __syncthreads();  // qw copied by every thread
        if (threadIdx.x == 0) {
          sh.zr = total;
          sh.residual = true;
          sh.empty = !(total > 0.0f);
          if (p.without_replacement) {
            sh.zq -= qw[sh.x];
            qw[sh.x] = 0.0f;
            sh.q_copied = true;
          }
        }
        __syncthreads();
        if (sh.empty) break;
      }
    }
    __syncthreads();
    const int64_t chosen = sh.chosen;
    if (chosen < 0) {
      if (threadIdx.x == 0) {  // the row's argmax, unless the sampling pass draws
        const bool draw = !point_mass && !sh.empty;
        p.out_tokens[n * m + acc] = s.top.idx;
        p.accept_len[n] = acc;
        w.jobs[n] = StopJob{draw ? static_cast<int32_t>(node) : -1, static_cast<int32_t>(acc), sh.rejected,
                            sh.residual, s.top.idx};
      }
      break;
    }
    if (threadIdx.x == 0) {
      p.out_tokens[n * m + acc] = tokens[chosen];
      p.path[n * m + acc + 1] = chosen;
    }
    ++acc;
    node = chosen;
    __syncthreads();  // sh and the shared reduction buffers are reused for the next node
  }
  for (int64_t j = threadIdx.x; j < m; j += kThreads) {
    if (j == 0) p.path[n * m] = 0;
    if (j > acc) p.path[n * m + j] = -1;
    if (j > acc) p.out_tokens[n * m + j] = -1;
  }
}

// The stop rows' Gumbel-max, each row split in w.sample_slices slices over the grid (one block a
// sequence had left the draw, Philox-bound, on a single SM). Weights: the scaled logits without the
// rejected tokens, or log r. Every block starts from the exact score of the row's argmax.
template <typename T>
__global__ void __launch_bounds__(kThreads) tree_sample_kernel(TreeVerifyParams p, VerifyWorkspace w, bool vector_ok) {
  __shared__ ArgMax start;
  const int64_t n = blockIdx.x / w.sample_slices, m = p.m, v = p.v;
  const int slice = static_cast<int>(blockIdx.x % w.sample_slices);
  const StopJob job = w.jobs[n];
  if (job.node < 0) return;  // the same for the whole block
  const uint64_t seed = read_or(p.seed_ptr, p.seed), offset = read_or(p.offset_ptr, p.offset);
  const uint32_t sequence = static_cast<uint32_t>(n), node = static_cast<uint32_t>(job.node);
  const T* row = static_cast<const T*>(p.logits) + (n * m + job.node) * v;
  const float* r = job.residual ? w.r + n * v : nullptr;
  const int32_t* rejected = w.rejected + n * m;
  if (threadIdx.x == 0) {
    const int32_t x = job.top;
    float wt = kNegInf;
    if (job.residual) {
      wt = r[x] > 0.0f ? log_f32(r[x]) : kNegInf;
    } else {
      bool seen = false;
      for (int32_t k = 0; k < job.nrej; ++k) seen |= rejected[k] == x;
      if (!seen) wt = scaled(row, x, p.inv_t);
    }
    start = gumbel_score(wt, x, seed, offset, sequence, node);
  }
  __syncthreads();
  ArgMax best = start;
  const auto observe = [&](int64_t g, const Four& a, int cnt) {
    float wt[4];
    stop_weights(a.x, g, cnt, job.residual, rejected, job.nrej, best.val, wt);
    tree_sample_group(best, seed, offset, sequence, node, static_cast<uint32_t>(g), wt, cnt);
  };
  const SliceRange range = slice_range(v, 4, w.sample_slices, slice);
  const int64_t vector_end = vector_ok ? vector_span_end(range.begin, range.end, v / 4) : range.begin;
  for_each_batched<4>(
      range.begin + threadIdx.x, vector_end, kThreads,
      [&](int64_t g) {
        Four a;
        if (r)
          unpack<float>(reinterpret_cast<const float4*>(r)[g], 1.0f, a.x);
        else
          unpack<T>(reinterpret_cast<const typename Quad<T>::type*>(row)[g], p.inv_t, a.x);
        return a;
      },
      [&](int64_t g, const Four& a) { observe(g, a, 4); });
  for (int64_t g = vector_end + threadIdx.x; g < range.end; g += kThreads) {
    const int cnt = v - 4 * g < 4 ? static_cast<int>(v - 4 * g) : 4;
    Four a;
#pragma unroll
    for (int j = 0; j < 4; ++j) a.x[j] = j >= cnt ? 0.0f : r ? r[4 * g + j] : scaled(row, 4 * g + j, p.inv_t);
    observe(g, a, cnt);
  }
  best = block_merge(best, argmax_empty());
  if (threadIdx.x == 0) w.slices[blockIdx.x] = best;
}

// A warp a sequence merges the slices of its draw (at most kMaxRowSlices) and writes the token.
__global__ void __launch_bounds__(kThreads) tree_sample_finish_kernel(TreeVerifyParams p, VerifyWorkspace w) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= p.n) return;
  const StopJob job = w.jobs[n];
  if (job.node < 0) return;
  const ArgMax best = warp_merge_slices(w.slices + n * w.sample_slices, w.sample_slices, argmax_empty());
  if (lane == 0 && best.idx != kNoIndex) p.out_tokens[n * p.m + job.acc] = best.idx;
}

template <typename E>
__global__ void compact_kv_kernel(CompactKvParams p) {
  const int64_t s = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  int64_t a = p.accept_len[s];
  a = a < 0 ? 0 : a > p.m - 1 ? p.m - 1 : a;
  const int64_t* path = p.path + s * p.m;
  E* base = reinterpret_cast<E*>(p.cache) + s * p.stride0 + h * p.stride1;
  int64_t prev = 0;
  // Increasing j: a source (path[j] >= j) is never a slot an earlier step wrote, so the threads
  // need no barrier between steps.
  for (int64_t j = 1; j <= a; ++j) {
    const int64_t src = path[j];
    if (src < j || src <= prev || p.prefix_len + src >= p.len) break;  // an invalid path stops the moves
    prev = src;
    if (src == j) continue;
    E* dst_row = base + (p.prefix_len + j) * p.stride2;
    const E* src_row = base + (p.prefix_len + src) * p.stride2;
    for (int64_t e = threadIdx.x; e < p.d; e += blockDim.x) dst_row[e] = src_row[e];
  }
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

template <typename T>
cudaError_t launch_verify_typed(const TreeVerifyParams& p, const VerifyWorkspace& w, cudaStream_t stream) {
  // Rows of logits, q and r start 16-byte aligned (r's rows are v floats from a 256-byte aligned base).
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && p.v % 4 == 0 &&
                         reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 &&
                         (p.q == nullptr || reinterpret_cast<uintptr_t>(p.q) % 16 == 0);
  tree_verify_kernel<T><<<p.n, kThreads, 0, stream>>>(p, w, vector_ok);
  if (p.inv_t != 0.0f) {  // greedy walks write every token themselves
    tree_sample_kernel<T><<<p.n * w.sample_slices, kThreads, 0, stream>>>(p, w, vector_ok);
    tree_sample_finish_kernel<<<(p.n + kWarps - 1) / kWarps, kThreads, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

}  // namespace

size_t tree_build_workspace_bytes(const TreeBuildParams& p) {
  return build_smem_bytes(p) ? 0 : align_up(sizeof(TreeCandidate) * p.n * (p.budget + 1));
}

cudaError_t launch_build_draft_tree(const TreeBuildParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const size_t smem = build_smem_bytes(p);
  build_tree_kernel<<<p.n, 32, smem, stream>>>(p, static_cast<TreeCandidate*>(workspace), smem != 0);
  return cudaGetLastError();
}

cudaError_t launch_tree_mask(const TreeMaskParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const size_t smem = mask_smem_bytes(p);
  tree_mask_kernel<<<p.n, kThreads, smem, stream>>>(p, smem != 0);
  return cudaGetLastError();
}

size_t tree_verify_workspace_bytes(const TreeVerifyParams& p) {
  const size_t lists = 2 * align_up(sizeof(int32_t) * p.n * p.m);
  const size_t rows = p.q ? align_up(sizeof(float) * p.n * p.v) * (p.without_replacement ? 2 : 1) : 0;
  const size_t draws = align_up(sizeof(StopJob) * p.n) +
                       align_up(sizeof(ArgMax) * p.n * row_slice_count(p.n, p.v, p.num_sms));
  return lists + rows + draws;
}

cudaError_t launch_tree_verify(const TreeVerifyParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  char* at = static_cast<char*>(workspace);
  VerifyWorkspace w{};
  w.kids = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.m);
  w.rejected = reinterpret_cast<int32_t*>(at);
  at += align_up(sizeof(int32_t) * p.n * p.m);
  if (p.q) {
    w.r = reinterpret_cast<float*>(at);
    at += align_up(sizeof(float) * p.n * p.v);
    if (p.without_replacement) {
      w.qw = reinterpret_cast<float*>(at);
      at += align_up(sizeof(float) * p.n * p.v);
    }
  }
  w.jobs = reinterpret_cast<StopJob*>(at);
  at += align_up(sizeof(StopJob) * p.n);
  w.slices = reinterpret_cast<ArgMax*>(at);
  w.sample_slices = row_slice_count(p.n, p.v, p.num_sms);
  switch (p.dtype) {
    case LogitsType::kFloat32: return launch_verify_typed<float>(p, w, stream);
    case LogitsType::kBFloat16: return launch_verify_typed<__nv_bfloat16>(p, w, stream);
    case LogitsType::kFloat16: return launch_verify_typed<__half>(p, w, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_compact_kv(const CompactKvParams& p, cudaStream_t stream) {
  if (p.n == 0 || p.heads == 0) return cudaSuccess;
  const int64_t blocks = p.n * p.heads;
  switch (p.elem) {
    case 1: compact_kv_kernel<uint8_t><<<blocks, 128, 0, stream>>>(p); break;
    case 2: compact_kv_kernel<uint16_t><<<blocks, 128, 0, stream>>>(p); break;
    case 4: compact_kv_kernel<uint32_t><<<blocks, 128, 0, stream>>>(p); break;
    case 8: compact_kv_kernel<uint64_t><<<blocks, 128, 0, stream>>>(p); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace xkernels::cuda
