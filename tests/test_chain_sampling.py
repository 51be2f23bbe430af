"""chain_verify and chain_verify_ragged with per-request sampling parameters, per-request streams,
ragged layouts and block verification (CPU kernels against xkernels.reference)."""

import itertools

import pytest
import torch

import xkernels
from tests.markov_target import assert_follows_each_kinds_law, kind_params
from tests.utils import mixed_sampling_params
from xkernels.reference import chain as ref_chain
from xkernels.reference import sampling as ref_sampling


def _random_batch(n, k, vocab, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k + 1, vocab, generator=g) * scale
    drafts = torch.randint(0, vocab, (n, k), generator=g)
    drafts[: n // 2] = logits[: n // 2, :k].argmax(-1)  # some chains that greedy rows accept
    q = torch.softmax(torch.randn(n, k, vocab, generator=g), -1)
    return logits, drafts, q


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("with_q", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_the_reference(method, with_q, dtype):
    n, k, vocab = 16, 3, 40
    logits, drafts, q = _random_batch(n, k, vocab, 1)
    logits = logits.to(dtype)
    q = q if with_q else None
    params = mixed_sampling_params(n, 2)
    got = xkernels.chain_verify(drafts, logits, draft_probs=q, method=method, return_logprobs=True, **params)
    want = ref_chain.chain_verify(drafts, logits, q, method=method, return_logprobs=True, **params)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(got[2], want[2], atol=2e-5, rtol=1e-5, equal_nan=True)


def test_scalar_form_keeps_todays_stream():
    """Through the ragged kernel, scalar parameters give chain_verify's tokens (keyed by row)."""
    n, k, vocab = 8, 3, 30
    logits, drafts, q = _random_batch(n, k, vocab, 3)
    for qq, t in itertools.product((None, q), (0.0, 0.7, 1.0)):
        plain = xkernels.chain_verify(drafts, logits, draft_probs=qq, temperature=t, seed=5, offset=9)
        routed = xkernels.chain_verify(drafts, logits, draft_probs=qq, temperature=t, seed=5, offset=9,
                                       return_logprobs=True)
        assert torch.equal(plain[0], routed[0]) and torch.equal(plain[1], routed[1])


@pytest.mark.parametrize("path", ["top_k", "top_p", "min_p", "all"])
def test_filter_at_a_large_vocabulary(path):
    """Each cut finder (the streaming top-k, the banded top-p, min-p) against the reference at
    V = 151936, over the bonus draw (K = 0), tokens and log-probabilities."""
    n, vocab = 4, 151936
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(n, 1, vocab, generator=g) * 2.5
    logits[0, 0, 1000:1040] = logits[0, 0].max() + 1  # planted ties above the rest
    drafts = torch.empty(n, 0, dtype=torch.int64)
    params = dict(top_k={"top_k": 50, "top_p": None, "min_p": None}, top_p={"top_k": None, "top_p": 0.9, "min_p": None},
                  min_p={"top_k": None, "top_p": None, "min_p": 0.05}, all={"top_k": 50, "top_p": 0.9, "min_p": 0.05})[path]
    for seed in range(2):
        seeds = torch.arange(n) + 10 * seed
        got = xkernels.chain_verify(drafts, logits, temperature=1.0, seed=seeds, offset=torch.zeros(n, dtype=torch.int64),
                                    return_logprobs=True, **params)
        want = ref_chain.chain_verify(drafts, logits, None, 1.0, seeds, torch.zeros(n, dtype=torch.int64),
                                      return_logprobs=True, **params)
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[2], want[2], atol=1e-4, rtol=1e-5)


def test_ties_at_the_cut_keep_the_lower_ids():
    """Equal logits at a cut: the lower ids are kept, so only they are ever drawn, and the
    log-probabilities are those of the kept set renormalised."""
    vocab = 12
    row = torch.tensor([0.0, 2.0, 1.0, 2.0, 2.0, 1.0, 2.0, 1.0, -1.0, 1.0, 0.5, 1.0])
    cases = [dict(top_k=2), dict(top_k=5), dict(top_p=0.3), dict(top_p=0.75), dict(min_p=0.5), dict(top_k=6, top_p=0.9)]
    for case in cases:
        mask = ref_sampling.filter_mask(row, **case)
        drawn = set()
        for s in range(200):
            out, emitted, lp = xkernels.chain_verify_ragged(
                torch.empty(0, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), row[None], max_spec_len=0,
                temperature=1.0, seed=torch.tensor([s]), offset=torch.tensor([0]), **case)
            token = int(out[0, 0])
            drawn.add(token)
            want = torch.log_softmax(torch.where(mask, row, float("-inf")), -1)[token]
            assert abs(float(lp[0, 0]) - float(want)) < 1e-5, (case, token)
        assert drawn == set(torch.nonzero(mask).flatten().tolist()), (case, drawn)
    # the rule itself: among the four ids at 2.0, top_k=2 keeps ids 1 and 3
    assert torch.nonzero(ref_sampling.filter_mask(row, top_k=2)).flatten().tolist() == [1, 3]


def test_batch_invariance():
    """Per-request streams: a row computed alone equals that row in the batch, and permuting the
    rows permutes the outputs."""
    n, k, vocab = 12, 3, 25
    logits, drafts, q = _random_batch(n, k, vocab, 5)
    params = mixed_sampling_params(n, 6)
    for method, qq in itertools.product(("token", "block"), (None, q)):
        full = xkernels.chain_verify(drafts, logits, draft_probs=qq, method=method, **params)
        for i in range(n):
            one = {key: value[i:i + 1] for key, value in params.items()}
            alone = xkernels.chain_verify(drafts[i:i + 1], logits[i:i + 1], method=method,
                                          draft_probs=None if qq is None else qq[i:i + 1], **one)
            assert torch.equal(alone[0], full[0][i:i + 1]) and torch.equal(alone[1], full[1][i:i + 1]), i
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(7))
        permuted = xkernels.chain_verify(drafts[perm], logits[perm], draft_probs=None if qq is None else qq[perm],
                                         method=method, **{key: value[perm] for key, value in params.items()})
        assert torch.equal(permuted[0], full[0][perm]) and torch.equal(permuted[1], full[1][perm])


@pytest.mark.parametrize("method", ["token", "block"])
def test_ragged_equals_single_requests(method):
    counts = [3, 0, 1, 4, 0, 2]
    n, vocab, max_spec = len(counts), 30, 5
    g = torch.Generator().manual_seed(8)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    drafts = torch.randint(0, vocab, (total,), generator=g, dtype=torch.int64).to(torch.int32)
    logits = torch.randn(total + n, vocab, generator=g) * 2
    q = torch.softmax(torch.randn(total, vocab, generator=g), -1)
    params = mixed_sampling_params(n, 9)
    out = torch.full((n, max_spec + 1), 7, dtype=torch.int32)  # caller buffers, written in place
    emitted = torch.zeros(n, dtype=torch.int32)
    lp = torch.zeros(n, max_spec + 1)
    res = xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=max_spec, draft_probs=q, method=method,
                                       out=out, num_emitted=emitted, logprobs=lp, **params)
    assert res[0] is out and res[1] is emitted and res[2] is lp
    want = ref_chain.chain_verify_ragged(drafts, cu, logits, max_spec, q, method=method, **params)
    assert torch.equal(out, want[0]) and torch.equal(emitted, want[1])
    start = 0
    for i, c in enumerate(counts):
        one = {key: value[i:i + 1] for key, value in params.items()}
        acc, toks = xkernels.chain_verify(drafts[start:start + c].long()[None], logits[start + i:start + i + c + 1][None],
                                          draft_probs=q[start:start + c][None], method=method, **one)
        assert int(emitted[i]) == int(acc[0]) + 1
        assert out[i, :c + 1].tolist() == toks[0].tolist()
        assert (out[i, c + 1:] == -1).all() and torch.isnan(lp[i, int(emitted[i]):]).all()
        start += c


def _decode_markov(transition_logits, q_table, rows_per_kind, length, k, method, with_q, seed):
    """Decodes `length` tokens after token 0 for rows_per_kind rows of each parameter kind
    (markov_target.KINDS), by repeated chain_verify calls on a first-order Markov target (row i of
    the target's logits conditions on the chain's token i); returns the tokens [rows, length]."""
    params = kind_params(rows_per_kind)
    n = len(params["temperature"])
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    seqs = [[0] for _ in range(n)]
    while min(len(s) for s in seqs) < length + 1:
        chain = torch.empty(n, k + 1, dtype=torch.int64)
        chain[:, 0] = torch.tensor([s[-1] for s in seqs])
        for j in range(k):
            chain[:, j + 1] = torch.multinomial(q_table[chain[:, j]], 1, generator=g)[:, 0]
        drafts = chain[:, 1:]
        q = q_table[chain[:, :k]] if with_q else None
        # per call its own slots: block verification reads every drafted slot's coin
        offset = torch.tensor([len(s) * (k + 1) for s in seqs])
        acc, out = xkernels.chain_verify(drafts, transition_logits[chain], draft_probs=q, seed=seeds, offset=offset,
                                         method=method, **params)
        for s, a, o in zip(seqs, acc.tolist(), out.tolist()):
            s.extend(o[:a + 1])
    return torch.tensor([s[1:length + 1] for s in seqs])


@pytest.mark.parametrize("method,with_q", [("token", True), ("token", False), ("block", True), ("block", False)])
def test_joint_law_of_decoded_tokens(method, with_q):
    """Three tokens decoded by repeated calls (K = 2) follow the filtered target's joint law, for
    every parameter kind mixed in one batch (chi-squared per kind); the same counts fail against
    the unfiltered law, so the test can see a wrong filter."""
    vocab, length, rows = 6, 3, 6000
    g = torch.Generator().manual_seed(11)
    transition_logits = torch.randn(vocab, vocab, generator=g) * 1.5
    q_table = torch.softmax(torch.randn(vocab, vocab, generator=g), -1)
    tokens = _decode_markov(transition_logits, q_table, rows, length, 2, method, with_q, seed=12)
    assert_follows_each_kinds_law(tokens, transition_logits, rows)


def test_block_accepts_at_least_as_many():
    """In expectation block verification accepts no fewer drafts than token-wise (Sun et al.)."""
    n, k, vocab = 4000, 4, 8
    g = torch.Generator().manual_seed(13)
    logits = torch.randn(n, k + 1, vocab, generator=g)
    q = torch.softmax(logits[:, :k] + torch.randn(n, k, vocab, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(n, k)
    seeds = torch.arange(n)
    token = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=seeds, offset=seeds * 0)
    block = xkernels.chain_verify(drafts, logits, draft_probs=q, temperature=1.0, seed=seeds, offset=seeds * 0,
                                  method="block")
    assert block[0].float().mean() >= token[0].float().mean() - 0.02


def test_greedy_rows_in_a_sampled_batch():
    n, k, vocab = 6, 3, 20
    logits, drafts, _ = _random_batch(n, k, vocab, 14)
    temps = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.5])
    got = xkernels.chain_verify(drafts, logits, temperature=temps, seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64))
    greedy = xkernels.chain_verify(drafts, logits, temperature=0.0)
    for i in (0, 2, 4):
        assert torch.equal(got[1][i], greedy[1][i])


def test_empty_batch_and_single_id_vocabulary():
    out, emitted, lp = xkernels.chain_verify_ragged(torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int32),
                                                    torch.empty(0, 5), max_spec_len=2, temperature=1.0, top_p=0.5)
    assert out.shape == (0, 3) and emitted.shape == (0,)
    out, emitted, lp = xkernels.chain_verify_ragged(torch.zeros(2, dtype=torch.int64), torch.tensor([2]),
                                                    torch.zeros(3, 1), max_spec_len=2, temperature=1.0, top_k=1,
                                                    top_p=0.3, min_p=1.0)
    assert out.tolist() == [[0, 0, 0]] and emitted.tolist() == [3] and lp.tolist() == [[0.0, 0.0, 0.0]]


def _ragged_call(**overrides):
    n, vocab = 2, 10
    args = dict(draft_tokens=torch.tensor([1, 2, 3]), cu_num_draft_tokens=torch.tensor([2, 3]),
                target_logits=torch.randn(5, vocab), max_spec_len=2, temperature=1.0)
    args.update(overrides)
    return xkernels.chain_verify_ragged(args.pop("draft_tokens"), args.pop("cu_num_draft_tokens"),
                                        args.pop("target_logits"), **args)


@pytest.mark.parametrize("overrides,name", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=torch.tensor([1.0, -0.5])), "temperature"),
    (dict(temperature=torch.tensor([1.0, float("nan")])), "temperature"),
    (dict(temperature=torch.tensor([1.0, 1.0, 1.0])), "temperature"),
    (dict(temperature=torch.tensor([1.0, 1.0], dtype=torch.float64)), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=torch.tensor([0.5, 0.0])), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=torch.tensor([0.5, 1.5])), "min_p"),
    (dict(top_k=-1), "top_k"), (dict(top_k=torch.tensor([3, -2])), "top_k"),
    (dict(top_k=torch.tensor([3.0, 2.0])), "top_k"),
    (dict(seed=torch.tensor([1, 2, 3])), "seed"), (dict(offset=torch.tensor([1.0, 2.0])), "offset"),
    (dict(cu_num_draft_tokens=torch.tensor([2, 1])), "cu_num_draft_tokens"),
    (dict(cu_num_draft_tokens=torch.tensor([1, 2])), "cu_num_draft_tokens"),
    (dict(max_spec_len=1), "max_spec_len"), (dict(max_spec_len=-1), "max_spec_len"),
    (dict(draft_tokens=torch.tensor([1, 2, 10])), "draft_tokens"),
    (dict(target_logits=torch.randn(4, 10)), "target_logits"),
    (dict(draft_probs=torch.rand(3, 9)), "draft_probs"),
    (dict(out=torch.empty(2, 2, dtype=torch.int32)), "output_token_ids"),
    (dict(num_emitted=torch.empty(2, dtype=torch.int64)), "num_emitted"),
    (dict(logprobs=torch.empty(2, 3, dtype=torch.float64)), "logprobs"),
    (dict(method="tree"), "method"),
])
def test_bad_input_names_the_argument(overrides, name):
    with pytest.raises((RuntimeError, ValueError), match=name):
        _ragged_call(**overrides)


def test_opcheck():
    n, vocab, width = 2, 10, 3
    for q in (None, torch.softmax(torch.randn(3, vocab), -1)):
        args = (torch.tensor([1, 2, 3]), torch.tensor([2, 3]), torch.randn(5, vocab), 2, q, 1.0,
                torch.tensor([0.5, 0.0]), 0, torch.tensor([3, 0]), 0.9, None, 0.0, None, 3, torch.tensor([1, 2]), 0,
                torch.tensor([5, 6]), True, torch.empty(n, width, dtype=torch.int32), torch.empty(n, dtype=torch.int32),
                torch.empty(n, width))
        torch.library.opcheck(torch.ops.xkernels.chain_verify_ragged_.default, args)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("with_q", [False, True])
def test_cuda_equals_cpu(method, with_q):
    """The same (seed, offset) gives the same tokens on both devices (log-probabilities within
    float32 rounding), with mixed per-request parameters at V = 151936."""
    n, k, vocab = 12, 3, 151936
    logits, drafts, q = _random_batch(n, k, vocab, 15)
    q = q if with_q else None
    params = mixed_sampling_params(n, 16)
    cpu = xkernels.chain_verify(drafts, logits, draft_probs=q, method=method, return_logprobs=True, **params)
    cuda = xkernels.chain_verify(drafts.cuda(), logits.cuda(), draft_probs=None if q is None else q.cuda(),
                                 method=method, return_logprobs=True, **{key: v.cuda() for key, v in params.items()})
    assert torch.equal(cuda[0].cpu(), cpu[0]) and torch.equal(cuda[1].cpu(), cpu[1])
    torch.testing.assert_close(cuda[2].cpu(), cpu[2], atol=1e-4, rtol=1e-5, equal_nan=True)


@pytest.mark.needs_cuda
def test_cuda_graph_capture_with_caller_buffers():
    """Captured once with the engine's buffers; advancing the per-request offsets in place gives
    the eager call's tokens at each replay."""
    counts, vocab = [2, 0, 3], 1000
    cu = torch.tensor(counts).cumsum(0).cuda()
    g = torch.Generator().manual_seed(17)
    logits = (torch.randn(sum(counts) + len(counts), vocab, generator=g) * 2).cuda()
    drafts = torch.randint(0, vocab, (sum(counts),), generator=g).cuda()
    params = {key: v.cuda() for key, v in mixed_sampling_params(len(counts), 18).items()}
    out = torch.empty(3, 4, dtype=torch.int32, device="cuda")
    emitted = torch.empty(3, dtype=torch.int32, device="cuda")
    lp = torch.empty(3, 4, device="cuda")
    call = lambda: xkernels.chain_verify_ragged(drafts, cu, logits, max_spec_len=3, out=out,  # noqa: E731
                                                num_emitted=emitted, logprobs=lp, **params)
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for _ in range(3):
        params["offset"] += 5
        graph.replay()
        replayed = out.clone(), emitted.clone()
        call()
        assert torch.equal(replayed[0], out) and torch.equal(replayed[1], emitted)
