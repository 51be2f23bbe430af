"""Hugging Face transformers interop (optional: `pip install xkernels[hf]`).

- `export_target(target, folder)` writes the shipped Qwen3-style target as a transformers Qwen3
  model folder (`config.json`, `model.safetensors`), and `export_tokenizer(folder)` the tokenizer
  as a `PreTrainedTokenizerFast` folder; `python -m xkernels export-hf OUT` writes both.
- `HFTarget(model, hidden_layers)` adapts a transformers causal LM to the target interface of
  `xkernels.decoding.generate` (which wraps a transformers model in it by itself): its forward with
  a `DynamicCache` cropped after verification, its embedding and LM head, and the hidden states of
  the drafter's layers. transformers' `hidden_states[-1]` is the last layer's output after the
  final norm, not the layer's own output; the adapter takes every layer's output with a forward
  hook instead, so layer L means the same thing as in `TargetLM`.
"""

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from .target import TargetLM


def _require_transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("this needs transformers: pip install 'xkernels[hf]'") from e
    return transformers


def qwen3_config(target: TargetLM):
    """The transformers Qwen3Config of a TargetLM."""
    transformers = _require_transformers()
    cfg = target.cfg
    return transformers.Qwen3Config(
        vocab_size=cfg.vocab_size, hidden_size=cfg.dim, intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, hidden_act="silu",
        attention_bias=False, tie_word_embeddings=False, max_position_embeddings=32768,
        bos_token_id=0, eos_token_id=0, pad_token_id=0)


def qwen3_state_dict(target: TargetLM) -> dict:
    """TargetLM's weights under transformers' Qwen3ForCausalLM names."""
    out = {"model.embed_tokens.weight": target.embed.weight, "model.norm.weight": target.norm.weight,
           "lm_head.weight": target.lm_head.weight}
    for i, block in enumerate(target.blocks):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": block.attn_norm.weight,
            p + "post_attention_layernorm.weight": block.mlp_norm.weight,
            p + "self_attn.q_proj.weight": block.attn.wq.weight,
            p + "self_attn.k_proj.weight": block.attn.wk.weight,
            p + "self_attn.v_proj.weight": block.attn.wv.weight,
            p + "self_attn.o_proj.weight": block.attn.wo.weight,
            p + "self_attn.q_norm.weight": block.attn.q_norm.weight,
            p + "self_attn.k_norm.weight": block.attn.k_norm.weight,
            p + "mlp.gate_proj.weight": block.mlp.gate.weight,
            p + "mlp.up_proj.weight": block.mlp.up.weight,
            p + "mlp.down_proj.weight": block.mlp.down.weight,
        })
    return {k: v.detach().float().contiguous() for k, v in out.items()}


def export_target(target: TargetLM, folder) -> Path:
    """Writes target as a transformers Qwen3 folder: AutoModelForCausalLM.from_pretrained(folder)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = qwen3_config(target)
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(folder)
    save_file(qwen3_state_dict(target), str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def export_tokenizer(folder, tokenizer_file=None) -> Path:
    """Writes the shipped tokenizer as a PreTrainedTokenizerFast folder (AutoTokenizer.from_pretrained)."""
    transformers = _require_transformers()
    from .shipped import WEIGHTS

    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file or WEIGHTS / "tokenizer.json"), eos_token="<|endoftext|>",
        bos_token="<|endoftext|>", pad_token="<|endoftext|>", mask_token="<|mask|>")
    tok.save_pretrained(folder)
    return Path(folder)


@dataclass
class _Dims:
    dim: int
    n_layers: int


class _Cache:
    """A transformers DynamicCache with the length / crop interface of TargetLM's KVCache."""

    def __init__(self, cache):
        self.hf = cache

    @property
    def length(self) -> int:
        return self.hf.get_seq_length()

    def crop(self, length: int) -> None:
        drop = self.length - length
        if drop > 0:
            self.hf.crop(-drop)  # a negative count removes that many: the same in transformers 4 and 5

    def commit(self, accept_len: torch.Tensor, written: int) -> None:
        """After a chain's forward of `written` tokens: keep the anchor and the accepted drafts."""
        self.crop(self.length - written + int(accept_len.max()) + 1)


class HFTarget:
    """A transformers causal LM as a target of xkernels.decoding.generate."""

    def __init__(self, model, hidden_layers: Sequence[int] = (), hidden_size=None):
        transformers = _require_transformers()
        cfg = model.config
        layers = _decoder_layers(model)
        if layers is None:
            raise ValueError(f"{type(model).__name__}: no decoder layers found (model.model.layers); "
                             "the adapter supports decoder-only causal LMs")
        bad = [i for i in hidden_layers if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(f"{type(model).__name__} has {len(layers)} layers; the drafter reads layers {bad}")
        if hidden_size is not None and cfg.hidden_size != hidden_size:
            raise ValueError(f"{type(model).__name__} has hidden_size {cfg.hidden_size} but the drafter expects "
                             f"{hidden_size}")
        if not hasattr(transformers.DynamicCache, "crop"):
            raise ValueError("this transformers version's DynamicCache cannot be cropped (DynamicCache.crop); "
                             "speculative decoding needs to drop rejected positions")
        if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", False):
            raise ValueError(f"{type(model).__name__} uses sliding-window attention, whose cache cannot be cropped")
        self.model = model
        self.cfg = _Dims(cfg.hidden_size, len(layers))
        self.lm_head = model.get_output_embeddings()
        self.embed = model.get_input_embeddings()
        self._layers = layers
        self._transformers = transformers
        # transformers 5 renames forward's past_key_values to cache.
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def new_cache(self) -> _Cache:
        return _Cache(self._transformers.DynamicCache(config=self.model.config))

    def __call__(self, tokens: torch.Tensor, cache: _Cache = None, hidden_layers: Sequence[int] = ()):
        captured = {}
        hooks = [self._layers[i].register_forward_hook(
            lambda _m, _in, out, i=i: captured.__setitem__(i, out[0] if isinstance(out, tuple) else out))
            for i in hidden_layers]
        try:
            start = 0 if cache is None else cache.length
            positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)[None]
            out = self.model(input_ids=tokens, use_cache=cache is not None, position_ids=positions,
                             **{self._cache_arg: None if cache is None else cache.hf})
        finally:
            for h in hooks:
                h.remove()
        return out.logits, [captured[i] for i in hidden_layers]


def _decoder_layers(model):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def as_target(model, drafter=None):
    """model itself if it is a TargetLM (or already adapted), else an HFTarget for the drafter's layers."""
    if isinstance(model, (TargetLM, HFTarget)):
        return model
    if not hasattr(model, "config") or not hasattr(model, "get_output_embeddings"):
        raise TypeError(f"target must be a TargetLM or a transformers causal LM, got {type(model).__name__}")
    layers = drafter.cfg.target_layers if drafter is not None else ()
    return HFTarget(model, layers, hidden_size=None if drafter is None else drafter.cfg.dim)


def export_all(out) -> Path:
    """The shipped target and tokenizer in one transformers folder."""
    from .shipped import load_target

    out = Path(out)
    export_target(load_target(), out)
    export_tokenizer(out)
    return out
