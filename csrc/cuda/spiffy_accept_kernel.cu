// spiffy_accept on CUDA, launches that never wait on the host. First a block a (sequence, node,
// row) picks the masked rows of the root and of each kept draft at the step the rule fixes for the
// node (dllm_step's row rule, dllm_row.cuh; spiffy_kernels.cuh's accept_prepared_step): the whole
// GPU at once. With filters, the prepared rows that filter go through the candidate pipeline before
// it (spiffy_filtered.cuh: a read a row it settles; the prepare kernel skips them), and the walk
// picks its own filtered rows through the same steps in its blocks. Then a thread
// block cluster of 8 or 4 blocks per sequence (sm_90+; one block below) walks the steps: a step
// whose picks were not prepared (a threshold's) has its masked rows dealt out to the team's blocks,
// a block a row, on the logits of the node reached, then cluster.sync; warp 0 of block 0 applies the
// selection, looks for a kept draft equal to the new block and lists the next step's rows;
// cluster.sync. A cluster's blocks are co-scheduled, so they may wait for each other; ordinary
// blocks could deadlock doing so. Both kernels are spiffy_kernels.cuh's; this file launches them
// unfiltered, spiffy_filtered_accept_[prepare_|cluster_]<type>_kernel.cu filtered.
#include "per_device.h"
#include "spiffy_kernels.cuh"

namespace xkernels::cuda {
namespace {

// The workspace of spiffy_accept carved from `base` (null: only sized); *bytes is its size.
AcceptWorkspace accept_workspace(const SpiffyAcceptParams& p, void* base, size_t* bytes) {
  char* at = static_cast<char*>(base);
  size_t used = 0;
  const auto take = [&](size_t size) {
    void* out = at ? at + used : nullptr;
    used += align_up(size);
    return out;
  };
  const size_t nl = static_cast<size_t>(p.n * p.l), nodes = nl * static_cast<size_t>(p.k + 1);
  AcceptWorkspace ws;
  ws.conf = static_cast<float*>(take(sizeof(float) * nodes));
  ws.x0 = static_cast<int64_t*>(take(sizeof(int64_t) * nodes));
  ws.chosen = static_cast<uint8_t*>(take(nl));
  ws.rows = static_cast<int64_t*>(take(sizeof(int64_t) * nl));
  ws.walk = static_cast<AcceptWalk*>(take(sizeof(AcceptWalk) * 2 * static_cast<size_t>(p.n)));
  if (p.rule.filtered && !p.radix_only) {  // the prepared rows' candidates: at most every node's
    ws.sums = static_cast<SliceSummary*>(take(sizeof(SliceSummary) * nodes));
    ws.cands = static_cast<Candidate*>(take(sizeof(Candidate) * kSliceKeep * nodes));
    ws.raw = static_cast<RowStats*>(take(sizeof(RowStats) * nodes));
    ws.settled = static_cast<int32_t*>(take(sizeof(int32_t) * nodes));
  }
  *bytes = used;
  return ws;
}

// Whether the prepare kernel picks the kept drafts' rows as well as the root's: where the walk's
// teams (n clusters of up to 8 blocks) would cover a small part of the SMs. A team reads a step's
// R rows in R / 8 rounds; the prepare reads up to n * (k + 1) * R rows a wave of num_sms, so it
// saves time over walks of S steps where n * (k + 1) < S * num_sms / 8, and it is wasted on the
// drafts no walk reaches. At n * (k + 1) <= num_sms / 4 it pays from walks of two steps (an
// estimate: no measurement calibrates it yet).
bool prepare_drafts(const SpiffyAcceptParams& p) {
  static PerDevice sms;
  const int num_sms = sms.get([] {
    int device = 0, count = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is no launch error: nothing prepared
      return PerDevice::Result{0, false};
    }
    return PerDevice::Result{count, true};
  });
  return p.n * (p.k + 1) <= num_sms / 4;
}

template <typename T>
cudaError_t accept_typed(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  size_t bytes = 0;
  AcceptWorkspace ws = accept_workspace(p, workspace, &bytes);
  ws.drafts = prepare_drafts(p);
  // Every row of both logits tensors starts 16-byte aligned (the vector loads of dllm_row.cuh).
  const bool vector_ok = (p.v * sizeof(T)) % 16 == 0 && reinterpret_cast<uintptr_t>(p.root_logits) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(p.draft_logits) % 16 == 0;
  // The rows whose step the rule fixes, picked before the walk (spiffy_accept_prepare_kernel).
  const cudaError_t prepared = p.rule.filtered ? launch_filtered_accept_prepare<T>(p, ws, vector_ok, stream)
                                               : launch_accept_prepare<T, false>(p, ws, vector_ok, stream);
  if (prepared != cudaSuccess) return prepared;
  const unsigned blocks = spiffy_accept_blocks(p);
  if (p.rule.filtered)
    return blocks == 1 ? launch_filtered_accept_walk<T, false>(p, ws, blocks, vector_ok, stream)
                       : launch_filtered_accept_walk<T, true>(p, ws, blocks, vector_ok, stream);
  return blocks == 1 ? launch_accept_walk<T, false, false>(p, ws, blocks, vector_ok, stream)
                     : launch_accept_walk<T, true, false>(p, ws, blocks, vector_ok, stream);
}

// Clusters of kSize blocks of spiffy_accept_kernel<T, true, false> the current device runs at once
// (cudaOccupancyMaxActiveClusters), asked once a device; a failed query (not kept) reads as "all":
// the cluster launch itself then says whether it can run. The filtered kernel is asked nothing: it
// also runs one block an SM, its 41 KB of shared memory within any SM's.
template <typename T, unsigned kSize>
int accept_clusters_at_once() {
  static PerDevice at_once;
  return at_once.get([] {
    cudaLaunchAttribute cluster{};
    const cudaLaunchConfig_t config = accept_cluster_config(1, kSize, &cluster);
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, spiffy_accept_kernel<T, true, false>, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // a query's failure is no launch error
      return PerDevice::Result{INT_MAX, false};
    }
    return PerDevice::Result{count, true};
  });
}

// Clusters of 8 while every sequence's cluster runs at once; else of 4, which pack the SMs more
// densely (a GPC with 14 SMs free holds one cluster of 8 but three of 4: on such a part 16
// sequences in clusters of 8 leave the last to run alone, twice the time, while clusters of 4 run
// all 16 together, each block reading twice the rows); none where neither size can run at all.
template <typename T>
unsigned accept_cluster_size(int64_t n) {
  if (accept_clusters_at_once<T, kAcceptCluster>() >= n) return kAcceptCluster;
  if (accept_clusters_at_once<T, kAcceptClusterSmall>() > 0) return kAcceptClusterSmall;
  return accept_clusters_at_once<T, kAcceptCluster>() > 0 ? kAcceptCluster : 1;
}

}  // namespace

size_t spiffy_accept_workspace_bytes(const SpiffyAcceptParams& p) {
  size_t bytes = 0;
  accept_workspace(p, nullptr, &bytes);
  return bytes;
}

unsigned spiffy_accept_blocks(const SpiffyAcceptParams& p) {
  if (!p.clusters || p.n > 0x7FFFFFFF / kAcceptCluster) return 1;
  // A build without an sm_90+ image of the kernel (a JIT from compute_80's PTX) has no clusters.
  // Asked once (the first call, on an sm_90+ device, usually comes before any graph capture).
  static const bool built_for_clusters = has_cluster_image(spiffy_accept_kernel<float, true, false>);
  if (!built_for_clusters) return 1;
  switch (p.dtype) {
    case LogitsType::kFloat32: return accept_cluster_size<float>(p.n);
    case LogitsType::kBFloat16: return accept_cluster_size<__nv_bfloat16>(p.n);
    case LogitsType::kFloat16: return accept_cluster_size<__half>(p.n);
  }
  return 1;
}

cudaError_t launch_spiffy_accept(const SpiffyAcceptParams& p, void* workspace, cudaStream_t stream) {
  if (p.n == 0 || p.l == 0) return cudaSuccess;
  return by_dtype(p.dtype, [&](auto tag) { return accept_typed<decltype(tag)>(p, workspace, stream); });
}

}  // namespace xkernels::cuda
