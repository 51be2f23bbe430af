"""The models' fused, cached products: training reaches every weight, and inference never uses a
stale copy after the weights change."""

import torch

from xkernels.models import TargetConfig, TargetLM


def tiny_target(seed=0):
    torch.manual_seed(seed)
    return TargetLM(TargetConfig(64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64))


def test_training_reaches_every_weight():
    target = tiny_target()
    logits, _ = target(torch.randint(0, 64, (2, 5)))
    logits.square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in target.parameters())


def test_inference_follows_weight_updates():
    target, tokens = tiny_target(), torch.randint(0, 64, (1, 6))
    with torch.inference_mode():
        before, _ = target(tokens)  # builds the cached products
    opt = torch.optim.SGD(target.parameters(), lr=0.5)
    target(tokens)[0].square().mean().backward()
    opt.step()  # in place: the caches must notice
    with torch.inference_mode():
        after, _ = target(tokens)
        fresh, _ = tiny_target_with(target)(tokens)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, fresh)


def test_a_model_made_under_inference_mode_runs():
    with torch.inference_mode():
        target = tiny_target()
        logits, _ = target(torch.randint(0, 64, (1, 4)))
    assert logits.shape == (1, 4, 64)


def tiny_target_with(source):
    """A new target holding source's current weights (no cached products)."""
    target = tiny_target(seed=1)
    target.load_state_dict(source.state_dict())
    return target


def test_the_fused_products_equal_separate_linears():
    target, tokens = tiny_target(), torch.randint(0, 64, (1, 7))
    with torch.no_grad():
        x = target.embed(tokens)
        attn = target.blocks[0].attn
        q, k, v = attn._project(x, (4, 2, 2), "_qkv", attn.wq, attn.wk, attn.wv)
        for got, lin, heads in [(q, attn.wq, 4), (k, attn.wk, 2), (v, attn.wv, 2)]:
            torch.testing.assert_close(got, torch.nn.functional.linear(x, lin.weight).view(1, 7, heads, -1))


def test_training_after_inference_in_the_same_process():
    """Caches built under inference_mode (the RoPE table, a frozen layer's products) must not leak
    inference tensors into a later autograd graph."""
    target, tokens = tiny_target(), torch.randint(0, 64, (1, 8))
    with torch.inference_mode():
        target(tokens)
    target.lm_head.weight.requires_grad_(False)  # frozen, as a drafter's training keeps the target's head
    logits, _ = target(tokens)
    logits.sum().backward()
    assert target.embed.weight.grad is not None and target.lm_head.weight.grad is None
