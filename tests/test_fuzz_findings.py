"""What the first fuzz campaign found (tests/fuzz/README.md), one regression test each, and the
decisions taken on the calls it found accepted silently."""

import os
import subprocess
import sys

import pytest
import torch

import xkernels
from xkernels import reference
from xkernels.spiffy import DraftGraph

META = "meta"


def long(*values):
    return torch.tensor(values, dtype=torch.long)


def first_line(exc):
    return str(exc).splitlines()[0]


# ---- a meta tensor among CPU ones: the fake kernel ran and returned outputs never written ----

def _refine_case():
    g = torch.Generator().manual_seed(0)
    n, b, d, r, h, v = 2, 3, 2, 4, 5, 7
    w = xkernels.RefinerWeights(torch.randn(v, r, generator=g), torch.randn(r, b, b, generator=g),
                                torch.randn(h, r, generator=g), torch.randn(h, r, generator=g),
                                torch.randn(r, h, generator=g), torch.randn(v, r, generator=g))
    return torch.randn(n, b, r, generator=g), torch.randint(0, v, (n, b), generator=g), torch.randn(n, d, v), w


def _rng_calls(name, value):
    """Every op that takes seed or offset, called with `name` = value and CPU tensors otherwise."""
    rng = {name: value}
    ctx, tokens, base, w = _refine_case()
    parents = long([-1, 0, 0])[None]
    block = long([9, 1, 9])[None]
    return {
        "chain_verify": lambda: xkernels.chain_verify(torch.randint(0, 50, (4, 1)), torch.randn(4, 2, 50),
                                                      temperature=1.0, **rng),
        "chain_verify (per-row form)": lambda: xkernels.chain_verify(
            torch.randint(0, 50, (4, 1)), torch.randn(4, 2, 50), temperature=1.0, top_k=3, **rng),
        "tree_verify": lambda: xkernels.tree_verify(long([-1, 3, 4])[None], parents, torch.randn(1, 3, 8),
                                                    temperature=1.0, **rng),
        "dllm_step at T = 0": lambda: xkernels.dllm_step(torch.randn(1, 3, 8), block, 9, **rng),
        "shard_row_stats": lambda: xkernels.shard_row_stats(torch.randn(2, 3, 8), 0, sample=True, temperature=1.0,
                                                            **rng),
        "refine_step": lambda: xkernels.refine_step(ctx, tokens, base, w, temperature=1.0, **rng),
        "jacobi_refine": lambda: xkernels.jacobi_refine(ctx, tokens[:, :2], base, w, max_iters=2, **rng),
        "sequential_refine": lambda: xkernels.sequential_refine(ctx, tokens[:, :2], base, w, **rng),
        "spiffy_accept": lambda: xkernels.spiffy_accept(torch.randn(1, 3, 8), torch.randn(1, 1, 3, 8),
                                                        block[:, None], long([0])[None], block, 9, **rng),
    }


@pytest.mark.parametrize("name", ["seed", "offset"])
def test_a_meta_seed_or_offset_among_cpu_tensors_raises(name):
    for op, call in _rng_calls(name, torch.tensor(5, device=META)).items():
        with pytest.raises(RuntimeError) as info:
            call()
        assert first_line(info.value).startswith(f"{name} must be on cpu like "), (op, str(info.value))


def test_mixed_devices_raise_naming_the_tensor():
    with pytest.raises(RuntimeError, match="^draft_tokens must be on cpu like target_logits, got meta"):
        xkernels.chain_verify(torch.randint(0, 50, (4, 1), device=META), torch.randn(4, 2, 50))
    with pytest.raises(RuntimeError, match="^path must be on meta like cache, got cpu"):
        xkernels.compact_kv_(torch.zeros(1, 2, 8, 4, device=META), long(0, 1)[None], long(1), 2)
    with pytest.raises(RuntimeError, match="^accept_len must be on cpu like cache, got meta"):
        xkernels.compact_kv_(torch.zeros(1, 2, 8, 4), long(0, 1)[None], long(1).to(META), 2)


def test_calls_all_on_meta_still_give_meta_outputs_of_the_real_shapes():
    drafts, logits = torch.randint(0, 50, (4, 2)), torch.randn(4, 3, 50)
    real = xkernels.chain_verify(drafts, logits, temperature=1.0, seed=torch.tensor(5))
    fake = xkernels.chain_verify(drafts.to(META), logits.to(META), temperature=1.0, seed=torch.tensor(5, device=META))
    assert [(t.device.type, t.shape) for t in fake] == [(META, t.shape) for t in real]
    cache = torch.zeros(1, 2, 8, 4, device=META)
    assert xkernels.compact_kv_(cache, long(0, 1)[None].to(META), long(1).to(META), 2) is cache


def test_device_messages_name_the_tensor_in_the_kernels_checks():
    """The CUDA test below on the CPU: the CPU kernel itself (redispatch; a meta tensor would send the
    call to the fake kernel) runs the checks the CUDA kernel runs (csrc/ops), with meta in CUDA's
    place. parents is [1, 1, 2] (wrong) and on another device: the device is reported first."""
    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    parents = long([-1, 0])[None]
    with pytest.raises(RuntimeError, match="^parents must be on meta like target_logits, got cpu"):
        torch.ops.xkernels.tree_verify.default.redispatch(cpu, parents.to(META), parents,
                                                          torch.randn(1, 2, 5, device=META))
    with pytest.raises(RuntimeError, match="^path must be on meta like cache, got cpu"):
        torch.ops.xkernels.compact_kv_.default.redispatch(cpu, torch.zeros(1, 2, 8, 4, device=META),
                                                          long(0, 1)[None], long(1).to(META), 2)


@pytest.mark.needs_cuda
def test_device_messages_name_the_tensor_on_cuda():
    cache = torch.zeros(1, 2, 8, 4, device="cuda")
    with pytest.raises(RuntimeError, match="^path must be on cuda:0 like cache, got cpu"):
        xkernels.compact_kv_(cache, long(0, 1)[None], long(1).cuda(), 2)
    with pytest.raises(RuntimeError, match="^accept_len must be on cuda:0 like cache, got cpu"):
        xkernels.compact_kv_(cache, long(0, 1)[None].cuda(), long(1), 2)
    parents = long([-1, 0])[None]
    with pytest.raises(RuntimeError, match="^parents must be on cuda:0 like target_logits, got cpu"):
        xkernels.tree_verify(parents.cuda(), parents, torch.randn(1, 2, 5, device="cuda"))


# ---- silent acceptance: the decisions ----

@pytest.mark.parametrize("bad", [2**40, -3, 8])
def test_dllm_block_ids_outside_the_vocabulary_raise(bad):
    """Decision: unmasked block ids must lie in [0, V) (the CPU always checks; CUDA under XKERNELS_CHECK=1)."""
    logits, block = torch.randn(2, 3, 8), long([9, bad, 9], [1, 2, 9])
    message = "block_tokens holds ids outside [0, 8) other than mask_id = 9"
    calls = [lambda: xkernels.dllm_step(logits, block, 9),
             lambda: xkernels.spiffy_accept(logits, torch.randn(2, 1, 3, 8), block[:, None], long([0], [0]), block, 9)]
    graph = DraftGraph([[], [(0, 0)]], [(0, 1)])
    calls.append(lambda: xkernels.spiffy_materialize(logits, block, 9, graph, keep=1))
    for call in calls:
        with pytest.raises(RuntimeError) as info:
            call()
        assert first_line(info.value) == message


@pytest.mark.parametrize("mask_id", [8, 2**40, -1])
def test_dllm_mask_id_outside_the_vocabulary_is_a_token_the_head_lacks(mask_id):
    """Decision: mask_id need not be a vocabulary id (a head without the mask token's logit):
    the call runs, nothing is excluded, as the reference does."""
    logits, block = torch.randn(2, 3, 8), long([mask_id, 1, mask_id], [2, mask_id, mask_id])
    got = xkernels.dllm_step(logits, block, mask_id, num_unmask=2)
    want = reference.dllm_step(logits, block, mask_id, num_unmask=2)
    assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3]))
    assert torch.allclose(got[3], want[3])


@pytest.mark.parametrize("bad", [-5, -1, 2**40, 2**31 - 1])
def test_build_draft_tree_refuses_candidates_that_are_no_token(bad):
    """Decision: topk_tokens must be ids (>= 0, below any vocabulary's 2^31 - 1); -1 would read as
    padding in the tree."""
    tokens = long([1, 2], [3, bad])[None]
    with pytest.raises(RuntimeError) as info:
        xkernels.build_draft_tree(torch.log(torch.tensor([[[0.6, 0.4], [0.7, 0.3]]])), tokens, 4)
    assert first_line(info.value) == "topk_tokens holds ids outside [0, 2147483647)"


@pytest.mark.parametrize("dim", [0, 1, 2])  # dim 3 has its own message: rows must be contiguous
def test_compact_kv_refuses_a_cache_whose_elements_share_memory(dim):
    """Decision: as torch's in-place ops, an expanded (stride-0) cache raises; a strided one works."""
    cache = torch.randn(2, 3, 6, 4)
    expanded = cache.narrow(dim, 0, 1).expand(cache.shape)
    path, accept_len = long([0, 2, 3], [0, 1, -1]), long(2, 1)
    with pytest.raises(RuntimeError, match="^cache must not be written in place where its elements share memory"):
        xkernels.compact_kv_(expanded, path, accept_len, 1)
    strided = torch.randn(2, 6, 3, 4).transpose(1, 2)  # [N, H, L, d] with L outermost
    want = reference.compact_kv(strided.clone(), path, accept_len, 1)
    assert torch.equal(xkernels.compact_kv_(strided, path, accept_len, 1), want)


def test_a_confidence_is_never_above_one():
    """The CPU took the mask token's term out of a float32 sum that holds the top's 1: rounding
    left 0.99999994 and a confidence of 1.0000001 (a later campaign's finding)."""
    logits = torch.tensor([[[-4.8046, -0.8256], [-1.9314, -1.2517]]])
    conf = xkernels.dllm_step(logits, torch.zeros(1, 2, dtype=torch.long), 0, num_unmask=2)[3]
    assert conf.max() <= 1.0 and torch.allclose(conf, torch.ones(1, 2))


def test_chain_verify_takes_int64_or_int32_drafts_in_either_form():
    drafts, logits = torch.randint(0, 5, (2, 1), dtype=torch.int16), torch.randn(2, 2, 5)
    with pytest.raises(RuntimeError, match="^draft_tokens must be int64, got Short"):
        xkernels.chain_verify(drafts, logits)
    with pytest.raises(ValueError, match="^draft_tokens must be int64 or int32, got torch.int16"):
        xkernels.chain_verify(drafts, logits, top_k=2)
    for kw in (dict(), dict(top_k=2)):
        assert torch.equal(xkernels.chain_verify(drafts.int(), logits, **kw)[1], xkernels.chain_verify(
            drafts.long(), logits, **kw)[1])


# ---- messages that did not name their argument ----

def test_a_budget_too_large_to_allocate_names_budget():
    small = torch.zeros(1, 1, 1)
    many = (2**24, 1, 1)  # stride 0: no memory; its outputs fit on no machine
    with pytest.raises(torch.OutOfMemoryError) as info:
        xkernels.build_draft_tree(small.expand(many), small.long().expand(many), 2**31 - 2)
    assert first_line(info.value).startswith("build_draft_tree: budget = 2147483646 (N = 16777216) asks for an output "
                                             "of shape [16777216, 2147483647]")


@pytest.mark.parametrize("args,kwargs,message", [
    ((0, 2**30 - 1, 0), {"layout": "packed"},
     "spiffy_attention_mask: num_drafts = 0, block_size = 1073741823, max_prefix_len = 0 asks for an output"),
    ((2**40, 2**40, 0), {}, "num_drafts must lie in [0, 2^31), got 1099511627776"),
    ((1, 2**40, 0), {}, "block_size must lie in [1, 2^31), got 1099511627776"),
    ((2**16, 2**16, 0), {},
     "(1 + num_drafts) * block_size = 4295032832 queries (num_drafts = 65536, block_size = 65536)"),
    ((1, 2, -3), {}, "prefix_len must lie in [0, 2^31), got -3"),
    ((1, 2, 2**40), {}, "prefix_len must lie in [0, 2^31), got 1099511627776"),
    ((1, 2, "7"), {}, "prefix_len must be an int, got str"),
])
def test_spiffy_attention_mask_names_the_argument(args, kwargs, message):
    with pytest.raises((RuntimeError, ValueError, TypeError)) as info:
        xkernels.spiffy_attention_mask(*args, **kwargs)
    assert first_line(info.value).startswith(message)


def test_scalars_of_the_wrong_type_name_their_argument():
    drafts, logits = torch.randint(0, 5, (2, 1)), torch.randn(2, 2, 5)
    for kwargs, message in [({"temperature": "hot"}, "temperature must be a float, got str"),
                            ({"seed": [1, 2]}, "seed must be an int, got list"),
                            ({"offset": None}, "offset must be an int, got NoneType")]:
        with pytest.raises(TypeError, match=f"^{message}$"):
            xkernels.chain_verify(drafts, logits, **kwargs)
    with pytest.raises(TypeError, match="^logits must be a torch.Tensor or support DLPack, got NoneType$"):
        xkernels.shard_row_stats(None, 0)


def test_shard_row_stats_vocab_start_cannot_wrap_around():
    message = r"^vocab_start \+ V_local \(logits. last size\) = 9223372036854775807 \+ 4 is too large"
    with pytest.raises(RuntimeError, match=message):
        xkernels.shard_row_stats(torch.randn(1, 2, 4), 2**63 - 1)


# ---- the campaign over per-row sampling arguments (every sampling op's engine form) ----

def _sampling_calls(**kwargs):
    """Every op that takes sampling parameters, with a per-row top_k (chain_verify's per-row form)
    and kwargs."""
    ctx, tokens, base, w = _refine_case()
    block = long(9, 1, 9)[None]
    params = dict(top_k=long(2), **kwargs)
    graph = DraftGraph([frozenset(), frozenset({(0, 0)})], [(0, 1)])
    return {
        "chain_verify": lambda: xkernels.chain_verify(torch.randint(0, 8, (1, 1)), torch.randn(1, 2, 8), **params),
        "tree_verify": lambda: xkernels.tree_verify(long(-1, 3)[None], long(-1, 0)[None], torch.randn(1, 2, 8),
                                                    **params),
        "refine_step": lambda: xkernels.refine_step(ctx[:1], tokens[:1], base[:1], w, **params),
        "dllm_step": lambda: xkernels.dllm_step(torch.randn(1, 3, 8), block, 9, **params),
        "spiffy_materialize": lambda: xkernels.spiffy_materialize(torch.randn(1, 3, 8), block, 9, graph, keep=1,
                                                                  **params),
        "spiffy_accept": lambda: xkernels.spiffy_accept(torch.randn(1, 3, 8), torch.randn(1, 1, 3, 8),
                                                        block[:, None], long(0)[None], block, 9, **params),
    }


@pytest.mark.parametrize("name", sorted(_sampling_calls()))
def test_a_temperature_of_none_raises_naming_it(name):
    # It was read as 0 (greedy) where the call took the per-row path, while the scalar path raised.
    _sampling_calls(temperature=0.0)[name]()
    with pytest.raises(TypeError, match="^temperature must be a float, got NoneType$"):
        _sampling_calls(temperature=None)[name]()


def test_shard_row_stats_temperature_of_none_raises_naming_it():
    with pytest.raises(TypeError, match="^temperature must be a float, got NoneType$"):
        xkernels.shard_row_stats(torch.randn(1, 2, 8), 0, temperature=None)


# ---- the CUDA kernels: the same value checks under XKERNELS_CHECK=1 ----

CUDA_VALUE_CASES = {
    "dllm_step block id": (lambda: xkernels.dllm_step(torch.randn(1, 3, 8, device="cuda"),
                                                      torch.tensor([[9, 2**40, 9]], device="cuda"), 9),
                           "block_tokens holds ids outside [0, 8) other than mask_id = 9"),
    "build_draft_tree token": (lambda: xkernels.build_draft_tree(torch.zeros(1, 1, 2, device="cuda"),
                                                                 torch.tensor([[[1, -5]]], device="cuda"), 2),
                               "topk_tokens holds ids outside [0, 2147483647)"),
}


@pytest.mark.needs_cuda
@pytest.mark.parametrize("checked", [False, True])
def test_cuda_value_checks_run_only_under_xkernels_check(checked):
    # XKERNELS_CHECK is read once per process: a child process. Unchecked, the kernels only copy
    # or compare these ids, so the calls return.
    script = (
        "import tests.test_fuzz_findings as t\n"
        "for name, (call, message) in sorted(t.CUDA_VALUE_CASES.items()):\n"
        "    try:\n"
        "        call()\n"
        "        raised = None\n"
        "    except RuntimeError as e:\n"
        "        raised = t.first_line(e)\n"
        f"    assert raised == (message if {checked} else None), (name, raised)\n"
        "print('ok')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XKERNELS_CHECK": "1" if checked else "0"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
