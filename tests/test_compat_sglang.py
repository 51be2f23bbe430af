"""xkernels.compat.sglang: SGLang's tree layout and verification signatures."""

import pytest
import torch

import xkernels
from xkernels.compat import sglang
from tests.test_distributed import _unread
from tests.utils import assert_replays_like_eager


def _random_tree(bs, m, vocab, seed):
    """Trees in xkernels' format (parents[i] < i) and SGLang's lists for the same trees."""
    g = torch.Generator().manual_seed(seed)
    parents = torch.full((bs, m), -1, dtype=torch.int64)
    for i in range(1, m):
        parents[:, i] = torch.randint(0, i, (bs,), generator=g)
    candidates = torch.randint(0, vocab, (bs, m), generator=g)
    next_token = torch.full((bs, m), -1, dtype=torch.int64)
    next_sibling = torch.full((bs, m), -1, dtype=torch.int64)
    for b in range(bs):
        last_child = {}
        for i in range(1, m):
            p = int(parents[b, i])
            if p in last_child:
                next_sibling[b, last_child[p]] = i
            else:
                next_token[b, p] = i
            last_child[p] = i
    retrive_index = torch.arange(bs * m).reshape(bs, m)
    return parents, candidates, next_token, next_sibling, retrive_index


def _sglang_greedy_walk(candidates, retrive_index, next_token, next_sibling, target_predict, steps):
    """SGLang's walk as its kernel states it, one request at a time in plain Python."""
    bs, m = candidates.shape
    predicts = torch.zeros(bs * m, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = int(next_token[b, cur])
            while cur != -1:
                if int(candidates[b, cur]) == int(target_predict[last]):
                    predicts[last] = int(target_predict[last])
                    accepted += 1
                    accept_index[b, accepted] = int(retrive_index[b, cur])
                    last = int(retrive_index[b, cur])
                    break
                cur = int(next_sibling[b, cur])
            if cur == -1:
                break
        accept_num[b] = accepted
        predicts[last] = int(target_predict[last])
    return predicts, accept_index, accept_num


def test_layout_converts_to_parents():
    parents, candidates, nxt, sib, _ = _random_tree(6, 12, 50, 0)
    tokens, got = sglang.tree_from_sglang(candidates, nxt, sib)
    assert torch.equal(got, parents) and torch.equal(tokens, candidates)


def test_bad_lists_name_the_argument():
    parents, candidates, nxt, sib, _ = _random_tree(2, 6, 50, 1)
    bad = nxt.clone()
    bad[0, 3] = 1
    with pytest.raises(RuntimeError, match="retrive_next_token"):
        sglang.tree_from_sglang(candidates, bad, sib)
    bad = sib.clone()
    bad[1, 2] = 2
    with pytest.raises(RuntimeError, match="retrive_next_sibling"):
        sglang.tree_from_sglang(candidates, nxt, bad)


@pytest.mark.parametrize("seed", range(4))
def test_verify_tree_greedy_matches_the_walk(seed):
    bs, m, vocab, steps = 8, 10, 6, 5
    parents, candidates, nxt, sib, retrive_index = _random_tree(bs, m, vocab, seed)
    g = torch.Generator().manual_seed(100 + seed)
    target_predict = torch.randint(0, vocab, (bs * m,), generator=g)
    # plant matches so that walks go deep
    for b in range(bs):
        for i in range(1, m):
            if torch.rand((), generator=g) < 0.5:
                target_predict[retrive_index[b, parents[b, i]]] = candidates[b, i]
    want = _sglang_greedy_walk(candidates, retrive_index, nxt, sib, target_predict, steps)
    predicts = torch.zeros(bs * m, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    sglang.verify_tree_greedy(predicts, accept_index, accept_num, candidates, retrive_index, nxt, sib, target_predict)
    assert torch.equal(accept_index, want[1]) and torch.equal(accept_num, want[2])
    touched = want[0] != 0
    assert torch.equal(predicts[touched], want[0][touched])


def test_target_only_sampling_is_tree_verify():
    bs, m, vocab, steps = 5, 9, 30, 9
    parents, candidates, nxt, sib, retrive_index = _random_tree(bs, m, vocab, 7)
    g = torch.Generator().manual_seed(8)
    target_probs = torch.softmax(torch.randn(bs, m, vocab, generator=g) * 2, -1)
    predicts = torch.zeros(bs * m, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.zeros(bs, dtype=torch.int32)
    sglang.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, candidates, retrive_index, nxt, sib, None, None, target_probs,
        torch.zeros_like(target_probs), seed=3, offset=1)
    accept_len, path, out = xkernels.tree_verify(candidates, parents, torch.log(target_probs), temperature=1.0, seed=3,
                                                 offset=1)
    assert torch.equal(accept_num.long(), accept_len)
    for b in range(bs):
        for d in range(int(accept_len[b]) + 1):
            assert int(accept_index[b, d]) == int(retrive_index[b, path[b, d]])
            assert int(predicts[retrive_index[b, path[b, d]]]) == int(out[b, d])
        assert (accept_index[b, int(accept_len[b]) + 1:] == -1).all()
    with pytest.raises(ValueError, match="threshold"):
        sglang.tree_speculative_sampling_target_only(
            predicts, accept_index, accept_num, candidates, retrive_index, nxt, sib, None, None, target_probs,
            torch.zeros_like(target_probs), threshold_acc=0.5)


def _sglang_case(device="cpu", steps=5):
    """A greedy and a sampled call of each SGLang entry point on `device`, into fresh buffers."""
    bs, m, vocab = 4, 8, 12
    _, candidates, nxt, sib, retrive_index = _random_tree(bs, m, vocab, 3)
    g = torch.Generator().manual_seed(4)
    target_predict = torch.randint(0, vocab, (bs * m,), generator=g)
    target_probs = torch.softmax(torch.randn(bs, m, vocab, generator=g) * 2, -1)
    d = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    candidates, nxt, sib, retrive_index, target_predict, target_probs = d(candidates, nxt, sib, retrive_index,
                                                                         target_predict, target_probs)
    seed, offset = torch.tensor(3, device=device), torch.tensor(1, device=device)

    def buffers():
        return (torch.zeros(bs * m, dtype=torch.int32, device=device),
                torch.full((bs, steps), -1, dtype=torch.int32, device=device),
                torch.zeros(bs, dtype=torch.int32, device=device))

    greedy = lambda: sglang.verify_tree_greedy(*buffers(), candidates, retrive_index, nxt, sib,  # noqa: E731
                                               target_predict)
    sampled = lambda: sglang.tree_speculative_sampling_target_only(  # noqa: E731
        *buffers(), candidates, retrive_index, nxt, sib, None, None, target_probs, torch.zeros_like(target_probs),
        seed=seed, offset=offset)
    return greedy, sampled, offset


def test_reads_nothing_on_the_host():
    """No .item() / .tolist() / int() of a tensor and no tensor made from host data in either entry
    point (the layout conversion included): on a GPU each would sync the host."""
    greedy, sampled, _ = _sglang_case()
    want = greedy(), sampled()
    with _unread():
        got = greedy(), sampled()
    for a, b in zip(got, want):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.needs_cuda
def test_captures_in_a_cuda_graph():
    greedy, sampled, offset = _sglang_case("cuda")
    assert_replays_like_eager(greedy, offset)
    assert_replays_like_eager(sampled, offset)
