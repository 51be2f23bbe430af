"""The C++ API (tests/cpp, built against the installed package) agrees with the Python wrapper.

tests/run.sh builds the program and sets XKERNELS_CPP_TEST to its path."""

import os
import subprocess

import pytest
import torch

import xkernels
from xkernels import ops

BINARY = os.environ.get("XKERNELS_CPP_TEST")


@pytest.fixture(scope="module")
def printed():
    """The program's lines "name value ..." as {name: [value, ...]}."""
    if not BINARY:
        pytest.skip("XKERNELS_CPP_TEST is not set (tests/run.sh builds tests/cpp)")
    lines = subprocess.run([BINARY], check=True, capture_output=True, text=True).stdout.splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines}


def test_chain_verify_matches_python(printed):
    torch.manual_seed(0)
    logits = torch.randn(4, 4, 50)
    drafts = torch.randint(0, 50, (4, 3))
    accept_len, out = xkernels.chain_verify(drafts, logits, temperature=1.0, seed=7, offset=3)
    assert [int(x) for x in printed["accept_len"]] == accept_len.tolist()
    assert [int(x) for x in printed["out_tokens"]] == out.flatten().tolist()
    assert printed["build_info"][0] == torch.ops.xkernels.build_info.default()


def test_shard_row_stats_matches_python(printed):
    """The program's sampled pass (int and tensor seeds gave it the same outputs) equals the
    Python op's, bit for bit (floats printed with the digits that round-trip float32)."""
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 20)
    rows = torch.tensor([[0, 3], [2, 2], [1, 0]])
    exclude = torch.tensor([5, -1, 24, 9, -1, -1, 7, 7, 6, -1, -1, -1]).reshape(3, 2, 2)
    want = ops.shard_row_stats(logits, 5, rows=rows, exclude=exclude, ignore_id=8, sample=True, temperature=0.7,
                               seed=11, offset=3)
    names = ("row_max", "row_sum", "top_id", "pick_score", "pick_id", "pick_logit")
    for name, w in zip(names, want, strict=True):
        got = torch.tensor([float(x) for x in printed[f"shard_{name}"]], dtype=torch.float64).to(w.dtype)
        assert torch.equal(got.view_as(w), w), name
    assert (want[4] >= 5).all()  # every row drew from the shard's ids


def test_shard_cut_select_matches_python(printed):
    """The program's 8 rounds of shard_cut_histogram and shard_cut_pick (a top-k of 7 on one rank)
    end at the key of each row's 7th-ranked id, as the Python ops and the reference's keys say; its
    shard_cut_candidates are each row's 7 lowest keys."""
    from xkernels.reference.shard_cut import CUT_SHIFTS, cut_rank_keys

    torch.manual_seed(3)
    logits = torch.randn(2, 300).bfloat16()
    scale = torch.full((2,), 0.8)
    prefix, before = torch.zeros(2, dtype=torch.int64), torch.zeros(2, 2, dtype=torch.int64)
    target = torch.full((2,), 7 * 2.0**62, dtype=torch.float64)
    for shift in CUT_SHIFTS:
        hist = ops.shard_cut_histogram(logits, scale, prefix, shift, 40)
        prefix, before = ops.shard_cut_pick(hist[:, :1].contiguous(), prefix, before, target)
    assert [int(x) for x in printed["cut_key"]] == prefix.tolist()
    keys = cut_rank_keys(logits.float() * 0.8, torch.arange(40, 340)).sort(1).values
    assert torch.equal(prefix, keys[:, 6])
    assert [int(x) for x in printed["candidate_keys"]] == keys[:, :7].flatten().tolist()


def test_per_row_sampling_matches_python(printed):
    """refine_step and dllm_step given one xkernels::Sampling (per-row temperatures with a greedy
    row, top_k 5, a per-row top_p, per-request streams) equal the Python ops, bit for bit."""
    torch.manual_seed(2)
    ctx, prev_tokens, base_logits = torch.randn(3, 4, 6), torch.randint(0, 20, (3, 4)), torch.randn(3, 2, 20)
    weights = xkernels.RefinerWeights(*(torch.randn(s) * 0.1 for s in ((20, 6), (6, 4, 4), (5, 6), (5, 6), (6, 5),
                                                                          (20, 6))))
    dllm_logits = torch.randn(3, 4, 20)
    sampling = dict(temperature=torch.tensor([0.0, 0.8, 1.5]), top_k=5, top_p=torch.tensor([1.0, 0.9, 0.6]),
                    seed=torch.tensor([11, 12, 13]), offset=torch.tensor([0, 4, 9]))
    tokens, logprobs = xkernels.refine_step(ctx, prev_tokens, base_logits, weights, **sampling)
    new_block, _, _, confidence = xkernels.dllm_step(dllm_logits, torch.full((3, 4), 19), 19, num_unmask=2, **sampling)
    for name, want in (("refine_tokens", tokens), ("refine_logprobs", logprobs), ("dllm_new_block", new_block),
                       ("dllm_confidence", confidence)):
        got = torch.tensor([float(x) for x in printed[name]], dtype=torch.float64).to(want.dtype)
        assert torch.equal(got.view_as(want), want), name


def test_filter_order_matches_python(printed):
    """refine_step given Sampling::filter_order "min_p_first" equals the Python op with it, bit for
    bit, and not the default order's results (the C++ API passes the order through)."""
    torch.manual_seed(4)
    ctx, prev_tokens, base_logits = torch.randn(3, 4, 6), torch.randint(0, 20, (3, 4)), torch.randn(3, 2, 20)
    weights = xkernels.RefinerWeights(*(torch.randn(s) * 0.1 for s in ((20, 6), (6, 4, 4), (5, 6), (5, 6), (6, 5),
                                                                          (20, 6))))
    sampling = dict(temperature=3.0, top_p=0.5, min_p=0.3, seed=5)
    want = xkernels.refine_step(ctx, prev_tokens, base_logits, weights, filter_order="min_p_first", **sampling)
    default = xkernels.refine_step(ctx, prev_tokens, base_logits, weights, **sampling)
    assert not torch.equal(want[1], default[1])
    for name, w in (("order_tokens", want[0]), ("order_logprobs", want[1])):
        got = torch.tensor([float(x) for x in printed[name]], dtype=torch.float64).to(w.dtype)
        assert torch.equal(got.view_as(w), w), name


def test_bad_arguments_name_them(printed):
    assert " ".join(printed["shard_error_rows"]).startswith("rows must be int64, got Int")
    assert " ".join(printed["shard_error_seed"]).startswith("seed must be an int64 tensor, got Int")
    assert " ".join(printed["order_error"]).startswith('filter_order must be "top_k_first" or "min_p_first", got "vllm"')


def test_build_draft_tree_with_mask_matches_python(printed):
    """The program's packed mask (the fused op's, which it checked against build_draft_tree and
    tree_attention_mask in both layouts) is the Python wrapper's."""
    torch.manual_seed(5)
    lp, tok = torch.randn(3, 4, 20).log_softmax(-1).topk(3, -1)
    mask = xkernels.build_draft_tree(lp, tok, 9, mask="packed")[4]
    assert [int(x) for x in printed["tree_packed_mask"]] == mask.flatten().tolist()
