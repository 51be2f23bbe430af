"""Spiffy: the ops against their references, the draft graph format, calibration on a toy trace,
and decoding that gives vanilla's tokens with fewer model calls."""

import json
import subprocess
import sys

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.decoding import dllm_generate
from xkernels.models.block_diffusion import BlockDiffusionConfig, BlockDiffusionLM
from xkernels.decoding.spiffy_calibration import select_graph, trace_lookahead
from xkernels.spiffy import DraftGraph, SpiffyConfig
from tests.test_dllm import MASK, step_case
from tests.utils import DEVICES, LOGIT_DTYPES, assert_replays_like_eager
from xkernels.models.shipped import WEIGHTS

# Nodes are listed out of order on purpose: DraftGraph sorts them topologically.
NODES = [[], [(0, 0), (1, 0)], [(0, 0)], [(0, 1)], [(0, 0), (1, 1)], [(0, 0), (2, 0)],
         [(0, 0), (1, 0), (2, 0)], [(0, 1), (1, 0)], [(0, 0), (3, 2)]]
EDGES = [(0, 2), (0, 3), (2, 1), (2, 4), (2, 5), (1, 6), (5, 6), (3, 7), (2, 8)]


def hand_graph(device="cpu"):
    return DraftGraph(NODES, EDGES, device=device)


def accept_case(n, k, length, v, dtype, seed):
    """Root logits, a graph's drafts from them, and draft logits under which drafts get accepted:
    each draft's logits are the root's with its unmasked positions' rows shuffled a little."""
    logits, block = step_case(n, length, v, dtype, seed=seed)
    drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, MASK, hand_graph(), keep=k)
    g = torch.Generator().manual_seed(seed + 1)
    draft_logits = (logits.float()[:, None] + 0.3 * torch.randn(n, k, length, v, generator=g)).to(dtype)
    return logits, draft_logits, drafts, node_ids, block


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("keep", [0, 1, 3, 8])
def test_materialize_matches_reference(device, dtype, temperature, keep):
    logits, block = step_case(6, 12, 53, dtype, seed=keep)
    block[1] = 3  # nothing masked: no node is usable
    block[2, 2:] = 3  # two masked positions: nodes with rank 2 or 3 are not
    logits[3, 4] = float("nan")  # a row without a softmax
    graph = hand_graph(device)
    got = xkernels.spiffy_materialize(logits.to(device), block.to(device), MASK, graph, keep=keep,
                                      temperature=temperature)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, keep,
                                        temperature)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    torch.testing.assert_close(got[2].cpu(), want[2], atol=1e-5, rtol=1e-4)


EMPTY_FILTERS = [{}, dict(temperature=0.7, top_k=5, top_p=0.9), dict(temperature=0.7, min_p=0.1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("filters", EMPTY_FILTERS)
@pytest.mark.parametrize("n, length", [(0, 4), (2, 0), (0, 0)])
def test_materialize_and_accept_of_empty_batches_and_blocks(device, filters, n, length):
    """No sequences, or blocks of no positions (where only the root-only graph fits): empty outputs
    of the right shapes on every path, filtered ones included, and the reference's the same."""
    graph = hand_graph(device) if length else DraftGraph([[]], [], device=device)
    keep = min(3, len(graph.ranks) - 1)
    logits, block = torch.randn(n, length, 11), torch.full((n, length), MASK, dtype=torch.int64)
    got = xkernels.spiffy_materialize(logits.to(device), block.to(device), MASK, graph, keep=keep, **filters)
    want = reference.spiffy_materialize(logits, block, MASK, graph.ranks, graph.child_ptr, graph.children, keep,
                                        filters.get("temperature", 0.0), filters.get("top_k"), filters.get("top_p"),
                                        filters.get("min_p"))
    assert [t.shape for t in got] == [(n, keep, length), (n, keep), (n, keep)]
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want))
    draft_logits = torch.randn(n, 2, length, 11)
    drafts, node_ids = torch.full((n, 2, length), MASK, dtype=torch.int64), torch.full((n, 2), -1, dtype=torch.int64)
    args = (logits, draft_logits, drafts, node_ids, block, MASK)
    got = xkernels.spiffy_accept(*(a.to(device) if torch.is_tensor(a) else a for a in args), **filters)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, reference.spiffy_accept(*args, **filters)))


def test_materialize_keeps_a_connected_set_of_filled_drafts():
    logits, block = step_case(4, 12, 53, seed=3)
    graph = hand_graph()
    drafts, node_ids, scores = xkernels.spiffy_materialize(logits, block, MASK, graph, keep=8)
    parents = {c: {a for a, b in graph.edges if b == c} for c in range(len(graph))}
    for s in range(4):
        kept = {0}
        ids = node_ids[s].tolist()
        used = ids.index(-1) if -1 in ids else len(ids)
        assert all(g == -1 for g in ids[used:]) and (drafts[s, used:] == block[s]).all()
        for r, g in enumerate(ids[:used]):
            assert g > 0 and parents[g] & kept, "a kept node has no kept parent"
            kept.add(g)
            changed = (drafts[s, r] != block[s]).nonzero().flatten()
            assert len(changed) == len(graph.nodes[g]) and (block[s, changed] == MASK).all()
        assert (scores[s, :used] > 0).all() and (scores[s, :used] <= 1).all() and (scores[s, used:] == 0).all()
    assert (node_ids[1] == -1).any()  # three masked positions: the node with rank 3 is not usable
    # (0, 0) is the most confident masked position with its best token
    conf = torch.softmax(logits, -1).max(-1)
    first = (node_ids[0] == graph.nodes.index(frozenset({(0, 0)}))).nonzero()[0, 0]
    masked = (block[0] == MASK).nonzero().flatten()
    p = masked[conf.values[0, masked].argmax()]
    assert drafts[0, first, p] == conf.indices[0, p]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOGIT_DTYPES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.2])
def test_accept_matches_reference(device, dtype, temperature, threshold):
    args = accept_case(5, 6, 10, 41, dtype, seed=2)
    args[-1][4] = 3  # nothing masked
    got = xkernels.spiffy_accept(*[a.to(device) for a in args], MASK, threshold=threshold, temperature=temperature,
                                 seed=5, offset=11)
    want = reference.spiffy_accept(*args, MASK, threshold=threshold, temperature=temperature, seed=5, offset=11)
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b)
    assert int(got[0][4]) == 0 and int(got[4][4]) == -1


def test_accept_takes_the_vanilla_steps_and_accepts_planted_drafts():
    """Drafts whose logits all equal the root's are the states vanilla steps reach: a chain of them
    is accepted to its end, and the committed steps are dllm_step's, one offset each."""
    logits, block = step_case(1, 10, 40, seed=4)
    chain = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, 5)], [(d, d + 1) for d in range(4)])
    drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, MASK, chain, keep=4)
    # the root's logits for every draft: the vanilla steps are (0, 0), (1, 0), ... in the root's ranks
    draft_logits = logits[:, None].expand(1, 4, 10, 40).contiguous()
    steps, positions, tokens, new_block, last = xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block,
                                                                     MASK, seed=1, offset=3)
    assert int(steps[0]) == 5 and int(last[0]) == 3
    state = block
    for t in range(5):
        state, pos, tok, _ = xkernels.dllm_step(logits, state, MASK, seed=1, offset=3 + t)
        assert int(positions[0, t]) == int(pos[0, 0]) and int(tokens[0, t]) == int(tok[0, 0])
    assert torch.equal(new_block, state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True])
def test_attention_mask_matches_reference_and_its_rule(device, packed):
    lens = torch.tensor([5, 0, 3], device=device)
    got = xkernels.spiffy_attention_mask(2, 4, lens, max_prefix_len=5, layout="packed" if packed else "bool")
    assert torch.equal(got.cpu(), reference.spiffy_attention_mask(lens.cpu(), 2, 4, 5, packed))
    mask = xkernels.spiffy_attention_mask(2, 4, 5).cpu()
    assert mask.shape == (12, 17)
    assert mask[:, :5].all()  # everyone sees the prefix
    for q in range(12):
        assert mask[q, 5:].nonzero().flatten().tolist() == list(range(q // 4 * 4, q // 4 * 4 + 4))


def test_flex_attention_mask_mod_matches_the_op():
    from torch.nn.attention.flex_attention import create_mask

    from xkernels.spiffy import spiffy_block_mask, spiffy_mask_mod

    got = create_mask(spiffy_mask_mod(4, 5), 1, 1, 12, 17, device="cpu")[0, 0]
    assert torch.equal(got, xkernels.spiffy_attention_mask(2, 4, 5))
    assert spiffy_block_mask(2, 4, 5, device="cpu", flex_block_size=16).shape[-2:] == (12, 17)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, draft_logits, drafts, node_ids, block = accept_case(2, 3, 8, 20, torch.float32, seed=1)
    g = hand_graph(device)
    d = lambda t: t.to(device)  # noqa: E731
    torch.library.opcheck(torch.ops.xkernels.spiffy_materialize.default,
                          (d(logits), d(block), MASK, g.ranks, g.child_ptr, g.children, 3, 0.5, None, 0, None, 1.0,
                           None, 0.0, None))
    torch.library.opcheck(torch.ops.xkernels.spiffy_accept.default,
                          (d(logits), d(draft_logits), d(drafts), d(node_ids), d(block), MASK, 1, None, 1.0, None, 0,
                           None, 1.0, None, 0.0, None, 3, None, 2, None))
    torch.library.opcheck(torch.ops.xkernels.spiffy_attention_mask.default, (d(torch.tensor([2, 4])), 2, 3, 4, True))


FILTER_OFF = (0.0, None, 0, None, 1.0, None, 0.0, None)  # the schema's sampling arguments, greedy


def _raw_graph(ranks, ptr, children):
    return (torch.tensor(ranks, dtype=torch.int32), torch.tensor(ptr, dtype=torch.int32),
            torch.tensor(children, dtype=torch.int32))


def test_bad_inputs_name_the_argument():
    logits, draft_logits, drafts, node_ids, block = accept_case(2, 3, 8, 20, torch.float32, seed=1)
    g = hand_graph()
    op = torch.ops.xkernels.spiffy_materialize.default
    ok = ([[[-1, -1]], [[0, 0]]], [0, 1, 1], [1])
    cases = [
        (lambda: xkernels.spiffy_materialize(logits, block, MASK, g, keep=9), "keep must be in"),
        (lambda: xkernels.spiffy_materialize(logits[0], block, MASK, g, keep=1), "logits must have shape"),
        (lambda: xkernels.spiffy_materialize(logits, block[:, :3], MASK, g, keep=1), "block_tokens must have shape"),
        (lambda: op(logits, block, MASK, *_raw_graph([[[-1, -1]], [[8, 0]]], ok[1], ok[2]), 1, *FILTER_OFF),
         "position rank 8 outside the block"),
        (lambda: op(logits, block, MASK, *_raw_graph([[[-1, -1]], [[0, 8]]], ok[1], ok[2]), 1, *FILTER_OFF),
         "vocabulary rank 8"),
        (lambda: op(logits, block, MASK, *_raw_graph(ok[0], [0, 1, 2], [1, 0]), 1, *FILTER_OFF), "no cycles"),
        (lambda: op(logits, block, MASK, *_raw_graph(ok[0], [0, 1, 1], [1]), 1, *FILTER_OFF) and
         op(logits, block, MASK, _raw_graph(ok[0], ok[1], ok[2])[0].long(), *_raw_graph(ok[0], ok[1], ok[2])[1:], 1,
            *FILTER_OFF), "graph_ranks must be int32"),
        (lambda: op(logits, block, MASK, _raw_graph(ok[0], ok[1], ok[2])[0], torch.tensor([0, 1], dtype=torch.int32),
                    torch.tensor([1], dtype=torch.int32), 1, *FILTER_OFF), "graph_child_ptr must have G \\+ 1"),
        (lambda: xkernels.spiffy_accept(logits, draft_logits[:, :2], drafts, node_ids, block, MASK),
         "draft_logits must have shape"),
        (lambda: xkernels.spiffy_accept(logits, draft_logits.half(), drafts, node_ids, block, MASK),
         "draft_logits must have root_logits' dtype"),
        (lambda: xkernels.spiffy_accept(logits, draft_logits, drafts.short(), node_ids, block, MASK),
         "draft_blocks must be int64"),
        (lambda: xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids[:, :1], block, MASK),
         "node_ids must be int64"),
        (lambda: xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block, MASK, num_unmask=0),
         "num_unmask must be >= 1"),
        (lambda: xkernels.spiffy_attention_mask(2, 4, torch.tensor([6]), max_prefix_len=5),
         "prefix_lens\\[0\\] = 6 must be in"),
        (lambda: xkernels.spiffy_attention_mask(-1, 4, 3), "num_drafts must lie in \\[0, 2\\^31\\), got -1"),
    ]
    with pytest.raises(ValueError, match="layout must be"):
        xkernels.spiffy_attention_mask(2, 4, 3, layout="dense")
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()


def test_draft_graph_orders_validates_and_round_trips():
    g = hand_graph()
    assert [len(ops) for ops in g.nodes] == sorted(len(ops) for ops in g.nodes)
    assert all(g.nodes[a] < g.nodes[b] and a < b for a, b in g.edges)
    assert g.children.tolist() == [c for a, b in sorted(g.edges) for c in [b]]
    back = DraftGraph.from_json(g.to_json())
    assert back.nodes == g.nodes and back.edges == g.edges and torch.equal(back.ranks, g.ranks)
    for nodes, edges, message in [
        ([[(0, 0)]], [], "root"),
        ([[], [(0, 0)], [(0, 0), (1, 0)]], [(0, 1), (2, 1)], "does not add operations"),  # a cycle 1 -> 2 -> 1
        ([[], [(0, 0)], [(1, 0)]], [(0, 1)], "no parent"),
        ([[], [(0, 0), (0, 1)]], [(0, 1)], "twice"),
        ([[], [(0, 9)]], [(0, 1)], "vocabulary ranks below"),
    ]:
        with pytest.raises(ValueError, match=message):
            DraftGraph(nodes, edges)
    with pytest.raises(ValueError, match="does not add"):
        DraftGraph.from_json(json.dumps({"nodes": [[], [[0, 0]]], "edges": [[1, 1], [0, 1]]}))


def test_the_graph_format_does_not_import_the_decoding_loop():
    """xkernels.spiffy (the format) and xkernels.decoding.spiffy_calibration (which replays decoding)
    import one way only: the format loads without the decoding package."""
    code = ("import sys, xkernels.spiffy; "
            "assert not [m for m in sys.modules if m.startswith('xkernels.decoding')], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_calibration_of_a_toy_trace():
    """Two blocks of hand-made steps over 4 positions (mask 7). Logits make position 3 then 2 then
    1 then 0 the most confident, token 5 best everywhere and token 6 second."""
    logits = torch.full((4, 10), -5.0)
    logits[:, 5], logits[:, 6] = 2.0, 1.0
    logits[:, 5] += torch.tensor([0.0, 1.0, 2.0, 3.0])  # confidence grows with the position
    m = 7

    def step(before, p, tok):
        after = before.clone()
        after[p] = tok
        return (logits, before, after)

    b0 = torch.full((4,), m)
    s1 = step(b0, 3, 5)
    s2 = step(s1[2], 2, 5)
    s3 = step(s2[2], 1, 6)  # the second-best token
    s4 = step(s3[2], 0, 5)
    walks = trace_lookahead([s1, s2, s3, s4], m, depth=2)
    # step 2 seen from step 1's logits over [m, m, m, 5]: position 2 has rank 0, position 1 rank 1
    assert walks == [[frozenset({(0, 0)}), frozenset({(0, 0), (1, 1)})],
                     [frozenset({(0, 1)}), frozenset({(0, 1), (1, 0)})],
                     [frozenset({(0, 0)})]]
    graph = select_graph(walks * 3 + [[frozenset({(0, 0)})]], budget=3, objective="v3")
    # values: {(0,0)} 7, {(0,1)} 3, {(0,0),(1,1)} 3 + 7 (its parent's count), {(0,1),(1,0)} 3 + 3
    assert graph.nodes == [frozenset(), frozenset({(0, 0)}), frozenset({(0, 0), (1, 1)})]
    assert graph.edges == [(0, 1), (1, 2)]


def tiny_model(seed=0, attention=True):
    torch.manual_seed(seed)
    cfg = BlockDiffusionConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=64,
                               block_size=8)
    model = BlockDiffusionLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10)  # confident enough that drafts get accepted
        if not attention:  # every masked position then has the same logits
            for block in model.blocks:
                block.attn.wo.weight.zero_()
    return model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_spiffy_decodes_exactly_what_vanilla_decodes(temperature, threshold):
    model = tiny_model()
    chain = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, 5)], [(d, d + 1) for d in range(4)])
    fewer = 0
    for seed in range(3):
        prompt = torch.randint(2, 64, (5 + 4 * seed,), generator=torch.Generator().manual_seed(seed))
        want, vanilla = dllm_generate(model, prompt, 20, block_size=8, temperature=temperature, seed=seed,
                                      threshold=threshold)
        for graph, keep in [(chain, 4), (hand_graph(), 5)]:
            got, stats = dllm_generate(model, prompt, 20, block_size=8, temperature=temperature, seed=seed,
                                       threshold=threshold, spiffy=SpiffyConfig(graph, keep))
            assert torch.equal(got, want)
            assert stats.steps == vanilla.steps and stats.model_calls <= vanilla.model_calls
            fewer += stats.model_calls < vanilla.model_calls
    assert fewer > 0 or threshold is not None  # thresholded steps unmask several tokens: the chain rarely fits


def test_a_planted_graph_is_accepted_and_saves_the_calls_it_should():
    """Without attention every masked position has the same logits, so the vanilla steps go left
    to right with the same token and the chain of (0, 0), (1, 0), ... is always accepted: block 0
    takes one plain call and then calls of keep + 1 steps. Its last call ends on a complete draft,
    so that call also takes block 1's first step from the next block laid out after the draft,
    and block 1 needs no plain call."""
    model = tiny_model(attention=False)
    keep = 3
    chain = DraftGraph([[]] + [[(i, 0) for i in range(d)] for d in range(1, 4)], [(d, d + 1) for d in range(3)])
    prompt = torch.randint(2, 64, (7,), generator=torch.Generator().manual_seed(0))
    want, vanilla = dllm_generate(model, prompt, 16, block_size=8)
    got, stats = dllm_generate(model, prompt, 16, block_size=8, spiffy=SpiffyConfig(chain, keep))
    assert torch.equal(got, want)
    assert vanilla.model_calls == 8 + 8  # the prompt and block 0 join the cache in a block's first call
    assert stats.steps_per_call == [1, 4, 3 + 1, 4, 3]
    assert stats.model_calls == 5


@pytest.mark.skipif(not (WEIGHTS / "block_diffusion.safetensors").exists(), reason="the model is not trained yet")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [None, 0.9])
def test_the_shipped_model_and_graphs_decode_held_out_prompts_like_vanilla(temperature, threshold):
    from xkernels import data
    from xkernels.models.shipped import load_block_diffusion, load_tokenizer
    from xkernels.spiffy import shipped_graph

    model, tok = load_block_diffusion(), load_tokenizer()
    config = SpiffyConfig(shipped_graph(threshold is not None), keep=8)
    saved = 0
    for domain in data.DOMAINS:
        for i, text in enumerate(data.held_out_prompts(domain, 2)):
            ids = torch.tensor(tok.encode(text).ids)
            want, vanilla = dllm_generate(model, ids, 32, temperature=temperature, seed=i, threshold=threshold)
            got, stats = dllm_generate(model, ids, 32, temperature=temperature, seed=i, threshold=threshold,
                                       spiffy=config)
            assert torch.equal(got, want)
            saved += vanilla.model_calls - stats.model_calls
    assert saved > 0


def test_the_flat_layout_under_the_spiffy_mask_matches_the_batched_copies():
    """A forward over [real block, copies] laid out in one sequence, under spiffy_attention_mask
    and spiffy_positions, gives each copy the logits of the batched forward (up to rounding)."""
    from xkernels.spiffy import spiffy_positions

    model = tiny_model()
    cache = model.new_cache()
    model.commit(torch.randint(2, 64, (1, 11), generator=torch.Generator().manual_seed(1)), cache)
    copies = torch.randint(1, 64, (3, 8), generator=torch.Generator().manual_seed(2))
    mask = xkernels.spiffy_attention_mask(2, 8, cache.length)
    assert torch.equal(spiffy_positions(2, 8, cache.length), torch.arange(11, 19).repeat(3))
    with torch.no_grad():
        flat = model.forward_flat(copies, cache, mask[:, cache.length:])
        batched = model(copies, cache)
    torch.testing.assert_close(flat, batched, atol=1e-4, rtol=1e-4)
    assert cache.length == 11  # neither call writes the cache
    shuffled = mask.clone()
    shuffled[:8, 11 + 8 : 11 + 16] = True  # the real block sees a draft: its logits change
    with torch.no_grad():
        leaked = model.forward_flat(copies, cache, shuffled[:, cache.length:])
    assert not torch.allclose(leaked[0], batched[0], atol=1e-4)


@pytest.mark.parametrize("prefix, tokens", [(0, 11), (0, 3), (9, 8), (9, 21), (9, 0)])
def test_forward_copies_is_a_commit_and_forwards_in_one_call(prefix, tokens):
    """The decoding loops' call: the cache it leaves and every copy's logits are commit's and
    forward's (up to rounding), from an empty cache (a prompt) or after a prefix, for spans that
    end mid-block or span several, or none; the copies' keys never reach the cache. A copy that
    follows a complete draft gets the logits of the next block after that draft, committed."""
    model = tiny_model()
    g = torch.Generator().manual_seed(prefix + tokens)
    head, span = torch.randint(2, 64, (1, prefix), generator=g), torch.randint(2, 64, (1, tokens), generator=g)
    copies = torch.randint(2, 64, (3, 8), generator=g)
    copies[:2, ::3] = model.cfg.mask_id  # the block and a draft; copy 2 is a complete draft
    masks = torch.full((1, 8), model.cfg.mask_id)
    apart, after_draft, merged = model.new_cache(), model.new_cache(), model.new_cache()
    with torch.no_grad():
        for cache in (apart, after_draft, merged):
            if prefix:
                model.commit(head, cache)
        for cache in (apart, after_draft):
            if tokens:
                model.commit(span, cache)
        model.commit(copies[2:], after_draft)
        want, want_next = model(copies, apart), model(masks, after_draft)
        got = model.forward_copies(torch.cat([copies, masks]), merged, commit=span if tokens else None,
                                   follows=[-1, -1, -1, 2])
    assert got.shape == (4, 8, 64)
    torch.testing.assert_close(got[:3], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[3:], want_next, atol=1e-4, rtol=1e-4)
    assert merged.length == apart.length == prefix + tokens
    for a, b in zip(apart.k + apart.v, merged.k + merged.v):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("follows", [[-1, 2, 1], [-1, 3, -1], [-1, -1]])
def test_forward_copies_rejects_a_bad_follows(follows):
    """A next block must follow a copy that follows none, inside the call, one entry a copy."""
    model = tiny_model()
    with pytest.raises(ValueError, match="follows"):
        model.forward_copies(torch.full((3, 8), 5), model.new_cache(), follows=follows)


@pytest.mark.needs_cuda
def test_spiffy_ops_are_cuda_graph_capturable():
    """materialize, the forward's stand-in and accept captured once, replayed with new offsets."""
    logits, block = step_case(3, 12, 53, seed=6)
    logits, block = logits.cuda(), block.cuda()
    graph = hand_graph("cuda")
    offset = torch.zeros((), dtype=torch.int64, device="cuda")  # 0-dim: one stream for the batch
    lens = torch.tensor([4, 9, 0], device="cuda")

    def step():
        drafts, node_ids, _ = xkernels.spiffy_materialize(logits, block, MASK, graph, keep=4, temperature=1.0)
        draft_logits = logits[:, None].expand(3, 4, 12, 53).contiguous()
        mask = xkernels.spiffy_attention_mask(4, 12, lens, max_prefix_len=9, layout="packed")
        return mask, xkernels.spiffy_accept(logits, draft_logits, drafts, node_ids, block, MASK, temperature=1.0,
                                            seed=3, offset=offset)

    assert_replays_like_eager(step, offset)


@pytest.mark.needs_cuda
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cpu_and_cuda_agree(temperature):
    args = accept_case(8, 6, 32, 4099, torch.bfloat16, seed=3)
    cpu = xkernels.spiffy_materialize(args[0], args[-1], MASK, hand_graph(), keep=6, temperature=temperature)
    gpu = xkernels.spiffy_materialize(args[0].cuda(), args[-1].cuda(), MASK, hand_graph("cuda"), keep=6,
                                      temperature=temperature)
    assert (cpu[1] == gpu[1].cpu()).all(-1).float().mean() > 0.9  # the rest only where scores near-tie
    got = xkernels.spiffy_accept(*[a.cuda() for a in args], MASK, temperature=temperature, seed=4)
    want = xkernels.spiffy_accept(*args, MASK, temperature=temperature, seed=4)
    assert (got[3].cpu() == want[3]).all(-1).float().mean() > 0.9  # the rest only where decisions near-tie
