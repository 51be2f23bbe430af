"""tree_verify with per-request sampling parameters (temperature, top_k, top_p, min_p) and
per-request streams: the CPU kernel against xkernels.reference, the joint law of decoded tokens
against the filtered target, batch invariance, the scalar form, bad input."""

import itertools

import pytest
import torch

import xkernels
from tests.markov_target import assert_follows_each_kinds_law, kind_params
from tests.test_tree import random_tree, verify_case
from tests.utils import mixed_sampling_params
from xkernels import reference


MODES = [(False, False), (True, False), (True, True)]  # (with draft_probs, without_replacement)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["star", "bushy"])
@pytest.mark.parametrize("with_q,without_replacement", MODES)
def test_matches_the_reference(dtype, kind, with_q, without_replacement):
    n, m, vocab = 16, 11, 40
    tokens, parents, logits, q = verify_case(n, m, vocab, kind, dtype, seed=3)
    params = mixed_sampling_params(n, 4)
    num_nodes = torch.tensor([11, 5, 1, 9] * 4)
    qq = q if with_q else None
    got = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, without_replacement=without_replacement,
                               num_nodes=num_nodes, **params)
    want = reference.tree_verify(tokens, parents, logits, qq, without_replacement, num_nodes=num_nodes, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_scalar_form_keeps_todays_stream():
    """Scalar calls give the tokens they gave before per-request parameters existed (pinned from
    the previous kernel), and a uniform temperature tensor the scalar's."""
    tokens, parents, logits, q = verify_case(6, 13, 37, "bushy", torch.float32, seed=21)
    pinned = [
        (None, False, 1.0, [0, 1, 1, 0, 0, 0],
         [[16, -1, -1, -1], [31, 31, -1, -1], [16, 6, -1, -1], [11, -1, -1, -1], [26, -1, -1, -1], [21, -1, -1, -1]]),
        (q, False, 0.8, [1, 2, 2, 1, 3, 1],
         [[20, 34, -1, -1], [31, 16, 23, -1], [16, 10, 11, -1], [10, 30, -1, -1], [13, 26, 29, 10], [22, 2, -1, -1]]),
        (q, True, 1.0, [1, 3, 2, 1, 3, 1],
         [[20, 34, -1, -1], [28, 22, 27, 2], [16, 10, 11, -1], [10, 7, -1, -1], [13, 26, 29, 10], [22, 2, -1, -1]]),
    ]
    for qq, wr, t, accept_len, out in pinned:
        for temperature in (t, torch.full((6,), t)):
            a, _, o = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, without_replacement=wr,
                                           temperature=temperature, seed=11, offset=2)
            assert a.tolist() == accept_len and o[:, :4].tolist() == out
        # the scalar stream may come as 0-dim tensors, and the filters as their off values
        a, _, o = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, without_replacement=wr, temperature=t,
                                       seed=torch.tensor(11), offset=torch.tensor(2), top_k=0, top_p=1.0, min_p=0.0)
        assert a.tolist() == accept_len and o[:, :4].tolist() == out


@pytest.mark.parametrize("with_q,without_replacement", MODES)
def test_batch_invariance(with_q, without_replacement):
    """Per-request streams: a sequence verified alone equals that sequence in the batch, and
    permuting the sequences permutes the outputs."""
    n, m, vocab = 12, 9, 25
    tokens, parents, logits, q = verify_case(n, m, vocab, "bushy", torch.float32, seed=5)
    q = q if with_q else None
    params = mixed_sampling_params(n, 6)
    kw = dict(without_replacement=without_replacement)
    full = xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **kw, **params)
    for i in range(n):
        one = {key: value[i:i + 1] for key, value in params.items()}
        alone = xkernels.tree_verify(tokens[i:i + 1], parents[i:i + 1], logits[i:i + 1],
                                     draft_probs=None if q is None else q[i:i + 1], **kw, **one)
        assert all(torch.equal(a, b[i:i + 1]) for a, b in zip(alone, full)), i
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(7))
    permuted = xkernels.tree_verify(tokens[perm], parents[perm], logits[perm],
                                    draft_probs=None if q is None else q[perm], **kw,
                                    **{key: value[perm] for key, value in params.items()})
    assert all(torch.equal(a, b[perm]) for a, b in zip(permuted, full))


def test_greedy_rows_in_a_sampled_batch():
    n, m, vocab = 6, 9, 20
    tokens, parents, logits, q = verify_case(n, m, vocab, "bushy", torch.float32, seed=14)
    temps = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.5])
    for qq in (None, q):
        got = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, temperature=temps, top_p=0.8,
                                   seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64))
        greedy = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, temperature=0.0)
        for i in (0, 2, 4):
            assert all(torch.equal(a[i], b[i]) for a, b in zip(got, greedy))


# The draft tree of each call: the root (the last committed token) with three children, the first
# two with a child each (M = 6), so the walk tests siblings, goes two deep, and stops anywhere.
TREE_PARENTS = [-1, 0, 0, 0, 1, 2]


def _decode_tree(transition_logits, q_table, rows_per_kind, length, with_q, without_replacement, seed):
    """Decodes `length` tokens after token 0 for rows_per_kind sequences of each parameter kind
    (markov_target.KINDS), all in one batch, by repeated tree_verify calls on a first-order Markov
    target (node i's row of the target's logits conditions on node i's token). The children of a
    node are drawn from q_table (with draft_probs: i.i.d. or without replacement, and q_table is
    their draft row); without draft_probs the proposals are drawn the same way but verified as
    deterministic."""
    params = kind_params(rows_per_kind)
    n, m, vocab = len(params["temperature"]), len(TREE_PARENTS), q_table.shape[0]
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    parents = torch.tensor(TREE_PARENTS).expand(n, m).contiguous()
    seqs = [[0] for _ in range(n)]
    while min(len(s) for s in seqs) < length + 1:
        tokens = torch.empty(n, m, dtype=torch.int64)
        tokens[:, 0] = torch.tensor([s[-1] for s in seqs])
        tokens[:, 1:4] = torch.multinomial(q_table[tokens[:, 0]], 3, replacement=not without_replacement,
                                           generator=g)
        for i in (4, 5):
            tokens[:, i] = torch.multinomial(q_table[tokens[:, TREE_PARENTS[i]]], 1, generator=g)[:, 0]
        offset = torch.tensor([len(s) * m for s in seqs])  # a call reads M slots; each call starts past them
        accept_len, _, out = xkernels.tree_verify(
            tokens, parents, transition_logits[tokens], draft_probs=q_table[tokens] if with_q else None,
            without_replacement=without_replacement, seed=seeds, offset=offset, **params)
        for s, a, o in zip(seqs, accept_len.tolist(), out.tolist()):
            s.extend(o[:a + 1])
    return torch.tensor([s[1:length + 1] for s in seqs])


@pytest.mark.parametrize("with_q,without_replacement", MODES)
def test_joint_law_of_decoded_tokens(with_q, without_replacement):
    """Three tokens decoded by repeated calls follow the filtered target's joint law, for every
    parameter kind mixed in one batch (chi-squared per kind); the same counts fail against the
    unfiltered law, so the test can see a wrong filter."""
    vocab, length, rows = 6, 3, 5000
    g = torch.Generator().manual_seed(11)
    transition_logits = torch.randn(vocab, vocab, generator=g) * 1.5
    q_table = torch.softmax(torch.randn(vocab, vocab, generator=g), -1)
    tokens = _decode_tree(transition_logits, q_table, rows, length, with_q, without_replacement, seed=12)
    assert_follows_each_kinds_law(tokens, transition_logits, rows)


def test_filters_at_a_large_vocabulary():
    """The cut finders at V = 151936 (top-k heap, top-p bands, min-p) inside a tree walk, against
    the reference."""
    n, m, vocab = 4, 4, 151936
    g = torch.Generator().manual_seed(4)
    parents = random_tree(n, m, "star")
    logits = torch.randn(n, m, vocab, generator=g) * 2.5
    logits[0, :, 1000:1040] = logits[0].max() + 1  # planted ties above the rest
    tokens = logits.argmax(-1).gather(1, parents.clamp_min(0))
    tokens[:, 2] = torch.randint(0, vocab, (n,), generator=g)
    tokens[:, 0] = -1
    params = dict(temperature=torch.tensor([1.0, 0.7, 1.2, 1.0]), top_k=torch.tensor([50, 0, 0, 50]),
                  top_p=torch.tensor([1.0, 0.9, 1.0, 0.9]), min_p=torch.tensor([0.0, 0.0, 0.05, 0.05]),
                  seed=torch.arange(n), offset=torch.zeros(n, dtype=torch.int64))
    got = xkernels.tree_verify(tokens, parents, logits, **params)
    want = reference.tree_verify(tokens, parents, logits, **params)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_empty_batch_and_single_id_vocabulary():
    got = xkernels.tree_verify(torch.zeros(0, 3, dtype=torch.int64), torch.zeros(0, 3, dtype=torch.int64),
                               torch.zeros(0, 3, 5), temperature=torch.zeros(0), top_p=torch.zeros(0) + 0.5,
                               seed=torch.zeros(0, dtype=torch.int64))
    assert [tuple(t.shape) for t in got] == [(0,), (0, 3), (0, 3)]
    accept_len, path, out = xkernels.tree_verify(torch.tensor([[-1, 0, 0]]), torch.tensor([[-1, 0, 1]]),
                                                 torch.zeros(1, 3, 1), temperature=1.0, top_k=1, top_p=0.3,
                                                 min_p=1.0)
    assert accept_len.tolist() == [2] and path.tolist() == [[0, 1, 2]] and out.tolist() == [[0, 0, 0]]


def _call(**overrides):
    tokens, parents, logits, q = verify_case(2, 6, 10, "bushy", torch.float32, seed=1)
    args = dict(temperature=1.0)
    args.update(overrides)
    return xkernels.tree_verify(tokens, parents, logits, **args)


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
    (dict(top_p="0.9"), "top_p"),
])
def test_bad_input_names_the_argument(overrides, name):
    with pytest.raises((RuntimeError, ValueError, TypeError), match=name):
        _call(**overrides)


def test_opcheck():
    tokens, parents, logits, q = verify_case(3, 9, 20, "bushy", torch.float32, seed=2)
    for qq, wr in itertools.product((None, q), (False, True)):
        args = (tokens, parents, logits, qq, wr, torch.tensor([9, 4, 1]), 1.0, torch.tensor([0.5, 0.0, 1.0]), 0,
                torch.tensor([3, 0, 2]), 0.9, None, 0.0, torch.tensor([0.0, 0.1, 0.2]), 3, torch.tensor([1, 2, 3]), 0,
                torch.tensor([5, 6, 7]))
        torch.library.opcheck(torch.ops.xkernels.tree_verify.default, args)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("with_q,without_replacement", MODES)
def test_cuda_equals_cpu(with_q, without_replacement):
    """Mixed per-request parameters and streams at V = 151936: the same tokens on both devices
    but where a decision lies within float32 rounding."""
    n, m, vocab = 12, 9, 151936
    tokens, parents, logits, q = verify_case(n, m, vocab, "bushy", torch.bfloat16, seed=15)
    q = q if with_q else None
    params = mixed_sampling_params(n, 16)
    kw = dict(without_replacement=without_replacement)
    cpu = xkernels.tree_verify(tokens, parents, logits, draft_probs=q, **kw, **params)
    cuda = xkernels.tree_verify(tokens.cuda(), parents.cuda(), logits.cuda(),
                                draft_probs=None if q is None else q.cuda(), **kw,
                                **{key: v.cuda() for key, v in params.items()})
    same = (cpu[2] == cuda[2].cpu()).all(-1)
    assert same.float().mean() >= 0.9


@pytest.mark.needs_cuda
def test_cuda_batch_invariance():
    n, m, vocab = 8, 9, 4099
    tokens, parents, logits, q = [t.cuda() for t in verify_case(n, m, vocab, "bushy", torch.bfloat16, seed=17)]
    params = {key: v.cuda() for key, v in mixed_sampling_params(n, 18).items()}
    for qq in (None, q):
        full = xkernels.tree_verify(tokens, parents, logits, draft_probs=qq, **params)
        for i in range(n):
            one = {key: value[i:i + 1] for key, value in params.items()}
            alone = xkernels.tree_verify(tokens[i:i + 1], parents[i:i + 1], logits[i:i + 1],
                                         draft_probs=None if qq is None else qq[i:i + 1], **one)
            assert all(torch.equal(a, b[i:i + 1]) for a, b in zip(alone, full)), i
