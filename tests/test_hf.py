"""Hugging Face transformers interop: the exported target loads as a Qwen3 model with the native
logits, and every decoding mode with the transformers model as target emits what transformers'
own greedy generate does. Skips where transformers is not installed."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from xkernels import data  # noqa: E402
from xkernels.decoding import MODES, generate  # noqa: E402
from xkernels.decoding.generate import TREE_MODES  # noqa: E402
from xkernels.models import hf, shipped  # noqa: E402
from tests.test_generate import tiny_models  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    hf.export_all(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return folder, model, shipped.load_all()


def prompts(models, count=2):
    return [models.tokenizer.encode(text).ids for domain in ("code", "math")
            for text in data.held_out_prompts(domain, count)]


def test_logits_equal_the_native_target(exported):
    _, model, models = exported
    assert type(model).__name__ == "Qwen3ForCausalLM"
    for ids in prompts(models):
        x = torch.tensor([ids])
        with torch.no_grad():
            torch.testing.assert_close(model(x).logits, models.target(x)[0], atol=2e-5, rtol=1e-5)


def test_tokenizer_loads_with_autotokenizer(exported):
    folder, _, models = exported
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = data.held_out_prompts("code", 1)[0]
    assert tok(text)["input_ids"] == models.tokenizer.encode(text).ids
    assert tok.decode(models.tokenizer.encode(text).ids) == text
    assert tok.mask_token == "<|mask|>"


@pytest.mark.parametrize("mode", [m for m in MODES if m not in TREE_MODES])
def test_every_mode_equals_transformers_generate(exported, mode):
    _, model, models = exported
    for ids in prompts(models):
        want = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=24)[0, len(ids):].tolist()
        got, stats = generate(model, ids, 24, mode=mode, drafter=models.drafter, refiner=models.refiner)
        # transformers stops at the end-of-text token (id 0); xkernels' loop decodes all 24.
        assert got[: len(want)] == want and (len(want) == 24 or want[-1] == model.config.eos_token_id)
        # The adapter hands the drafter the same layer outputs as the native target (compared with
        # every draft verified and the drafter in float32: the default rule reads measured times).
        fixed = dict(mode=mode, drafter=models.drafter, refiner=models.refiner, draft_len=None,
                     draft_dtype=torch.float32)
        assert generate(model, ids, 24, **fixed)[1].accept_lens == generate(models.target, ids, 24, **fixed)[1].accept_lens


def test_cli_export(tmp_path):
    from xkernels.__main__ import main

    main(["export-hf", str(tmp_path / "out")])
    assert (tmp_path / "out" / "config.json").exists() and (tmp_path / "out" / "model.safetensors").exists()
    assert (tmp_path / "out" / "tokenizer.json").exists()


def test_unsupported_models_are_refused_before_decoding():
    target, drafter, refiner = tiny_models(64)
    small = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12))
    with pytest.raises(ValueError, match="hidden_size 48 but the drafter expects 32"):
        generate(small, [1, 2, 3], 4, mode="drafter", drafter=drafter.float())
    one_layer = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8))
    with pytest.raises(ValueError, match=r"has 1 layers; the drafter reads layers \[1\]"):
        generate(one_layer, [1, 2, 3], 4, mode="jacobi", drafter=drafter.float(), refiner=refiner.float())
    with pytest.raises(TypeError, match="target must be a TargetLM or a transformers causal LM"):
        generate(object(), [1, 2, 3], 4)
    tiny_hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8))
    with pytest.raises(ValueError, match="needs a target that takes a tree attention mask"):
        generate(tiny_hf, [1, 2, 3], 4, mode="tree", drafter=drafter.float())
