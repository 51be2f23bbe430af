"""An engine's verify step, as a serving engine holds a batch: vLLM's flat layout, per-request
sampling parameters and streams as [N] tensors, buffers allocated once, the stream offset advanced
by xkernels.offset_advance, and on a GPU the whole step captured once in a CUDA graph and replayed.

Request n has K_n drafts (0 allowed): draft_tokens [T] holds them one request after another,
cu_num_draft_tokens [N] their inclusive cumulative counts, and target_logits [T + N, V] request n's
K_n draft rows then its bonus row. Random logits stand in for the engine's model here; the step is
what an engine copies.  Run: python python/examples/ragged_engine_step.py
"""

import torch

import xkernels
from xkernels.reference import chain as reference

device = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(0)
V, MAX_SPEC_LEN = 1000, 4
num_drafts = [3, 0, 4, 2]  # K_n of this step's N = 4 requests
N, T = len(num_drafts), sum(num_drafts)

# Step inputs, as an engine's buffers hold them (int32 ids and counts, as vLLM's).
cu = torch.tensor(num_drafts).cumsum(0)
target_logits = 3 * torch.randn(T + N, V, generator=g)
draft_rows = torch.arange(T) + torch.searchsorted(cu, torch.arange(T), right=True)  # row j + request of j
# A drafter close to the target: its rows at a higher temperature, the drafts sampled from them.
draft_probs = torch.softmax(target_logits[draft_rows] / 1.3, -1)
draft_tokens = torch.multinomial(draft_probs, 1, generator=g)[:, 0].to(torch.int32).to(device)
cu_num_draft_tokens, target_logits, draft_probs = cu.to(torch.int32).to(device), target_logits.to(device), draft_probs.to(device)

# Per-request parameters: greedy and sampled requests, each filter, in one call.
params = dict(temperature=torch.tensor([0.0, 0.7, 1.0, 1.2]), top_k=torch.tensor([0, 50, 0, 20]),
              top_p=torch.tensor([1.0, 0.9, 0.95, 1.0]), min_p=torch.tensor([0.0, 0.0, 0.05, 0.0]))
params = {k: v.to(device) for k, v in params.items()}
# A stream per request: its own seed for its lifetime, and an offset that each step advances past
# the slots the previous step read (reusing them would silently correlate the steps' noise).
seed = torch.tensor([11, 12, 13, 14], device=device)
offset = torch.zeros(N, dtype=torch.int64, device=device)

# Outputs: the engine's buffers, written in place (int32, as vLLM's sampled_token_ids).
out = torch.empty(N, MAX_SPEC_LEN + 1, dtype=torch.int32, device=device)
accept_len = torch.empty(N, dtype=torch.int32, device=device)
args = (draft_tokens, cu_num_draft_tokens, target_logits, out, accept_len)
advance = xkernels.offset_advance(xkernels.chain_verify_ragged_, *args, seed=seed)  # MAX_SPEC_LEN + 1


def step():
    """One verify step into the buffers, then the offset moved past what it read (on the device)."""
    xkernels.chain_verify_ragged_(*args, draft_probs=draft_probs, seed=seed, offset=offset, **params)
    offset.add_(advance)


with torch.no_grad():
    start = offset.clone()
    step()
    # The kernel draws what the reference draws from the same (seed, offset) of each request.
    want_out, emitted, _ = reference.chain_verify_ragged(draft_tokens, cu_num_draft_tokens, target_logits,
                                                         MAX_SPEC_LEN, draft_probs, seed=seed, offset=start, **params)
    assert torch.equal(out.cpu(), want_out.cpu()) and torch.equal(accept_len.cpu(), (emitted - 1).cpu())
    print("step 0: accepted drafts", accept_len.tolist(), "of", num_drafts)
    for n in range(N):
        print(f"  request {n}: emits {out[n, : accept_len[n] + 1].tolist()}")
    print(f"offset advanced by {advance} a step: {start.tolist()} -> {offset.tolist()}")

    if device == "cuda":
        # Capture once, replay per step: the graph reads the buffers (new logits and drafts copied
        # into them) and advances the offset in place, with no host read.
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # records the step without running it
            step()
        for i in range(3):
            at = offset.clone()
            graph.replay()
            eager_out = xkernels.chain_verify_ragged(draft_tokens, cu_num_draft_tokens, target_logits,
                                                     max_spec_len=MAX_SPEC_LEN, draft_probs=draft_probs, seed=seed,
                                                     offset=at, **params)[0]
            assert torch.equal(out, eager_out), i
        print("CUDA graph: 3 replays equal eager steps, offset now", offset.tolist())
    else:
        print("no GPU: the CUDA-graph part of this example runs where one is present")
