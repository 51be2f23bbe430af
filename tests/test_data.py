"""The corpus is deterministic and its held-out side is never trained on."""

import sysconfig

from xkernels import data


def test_held_out_code_files_are_not_training_files():
    train, held = data.code_files("train"), data.code_files("held_out")
    assert train and held
    assert not set(train) & set(held)
    assert train == sorted(train) and data.code_files("train") == train
    # The top-level test package and every tests/ folder are left out (the shipped models were
    # trained on exactly this list; test/ folders inside packages, like ctypes/test, are in).
    stdlib = sysconfig.get_paths()["stdlib"]
    rel = [p.relative_to(stdlib).as_posix() for p in train + held]
    assert not any(r.startswith("test/") or "/tests/" in r for r in rel)


def test_held_out_math_problems_are_new_and_deterministic():
    train = set(data.math_documents("train", 2000))
    held = list(data.math_documents("held_out", 200))
    assert len(set(held)) == 200 and not train & set(held)
    assert held == list(data.math_documents("held_out", 200))
    problem = held[0]
    assert problem.startswith("Question: ") and "\nAnswer: " in problem and "The answer is " in problem


def test_held_out_prompts():
    for domain in data.DOMAINS:
        prompts = data.held_out_prompts(domain, 3)
        assert len(prompts) == 3 and all(prompts) and prompts == data.held_out_prompts(domain, 3)
    assert all(p.endswith("Answer:") for p in data.held_out_prompts("math", 3))


def test_held_out_code_excludes_near_duplicates_of_training_files():
    """Generated codec tables and other near-copies of training files are not held-out prompts."""
    from collections import defaultdict

    index = defaultdict(list)
    for i, doc in enumerate(data.code_documents("train")):
        for line in data._line_set(doc):
            index[line].append(i)
    clean = data.held_out_code_documents()
    everything = list(data.code_documents("held_out"))
    assert 0 < len(clean) < len(everything)
    assert all(data.near_duplicate_share(d, index) < data.NEAR_DUPLICATE_SHARE for d in clean)
    assert not any("Character Mapping Codec" in d for d in clean)
    assert any("Character Mapping Codec" in d for d in everything)  # they were there before the filter
    assert not any("Character Mapping Codec" in p for p in data.held_out_prompts("code", 20))


def test_distillation_prompts_come_from_training_documents_only(monkeypatch):
    """python/train/distill_corpus.py (the block diffusion LM's stage 3) reads the train split only,
    and its math prompts are none of the held-out ones the benches evaluate."""
    import random
    import sys
    from pathlib import Path

    from xkernels.models.shipped import load_tokenizer

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "python" / "train"))
    monkeypatch.delitem(sys.modules, "distill_corpus", raising=False)
    import distill_corpus

    splits = []

    def spy(reader):
        def read(split, *args, **kwargs):
            splits.append(split)
            return list(reader(split, *args, **kwargs))[:40]  # enough files for the sample, quickly
        return read

    monkeypatch.setattr(data, "code_documents", spy(data.code_documents))
    monkeypatch.setattr(data, "math_documents", spy(data.math_documents))
    tok = load_tokenizer()
    prompts = {d: distill_corpus._prompts(d, 30, tok, random.Random(0)) for d in data.DOMAINS}
    assert splits and set(splits) == {"train"}
    assert all(len(p) == 30 and all(p) for p in prompts.values())
    math = {tok.decode(ids) for ids in prompts["math"]}
    held = {tok.decode(tok.encode(p).ids) for p in data.held_out_prompts("math", 200)}
    assert not math & held
