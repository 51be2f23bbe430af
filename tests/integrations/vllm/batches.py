"""Hand-built vLLM sampler inputs (as vLLM's tests/v1/sample build them), shared by the tests here
and bench/bench_vllm_sampler.py, the distribution vLLM's sampler samples without speculation, and
the report of what the tests measured."""

import os
from types import SimpleNamespace

import numpy as np
import torch
from scipy.stats import chisquare
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinPLogitsProcessor
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

_registered = []


def report(line):
    """Adds a line to $XKERNELS_VLLM_REPORT (run.sh prints it after the tests) when that is set."""
    path = os.environ.get("XKERNELS_VLLM_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def vllm_cpu_kernels():
    """vLLM's own sampler on the CPU runs its Triton kernels as C++ ops, which its worker registers."""
    if not _registered:
        from vllm.platforms import current_platform

        current_platform.register_triton_kernel_overrides()
        _registered.append(True)


def spec_metadata(drafts):
    """SpecDecodeMetadata of one list of draft ids per request, rows laid out as the model runner
    lays them: request n's draft rows, then its bonus row."""
    counts = [len(d) for d in drafts]
    ends = np.cumsum([k + 1 for k in counts])
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        num_draft_tokens=counts,
        cu_num_draft_tokens=torch.tensor(np.cumsum(counts), dtype=torch.int32),
        cu_num_sampled_tokens=torch.tensor(ends, dtype=torch.int32),
        target_logits_indices=torch.tensor([e - 1 - k + j for e, k in zip(ends, counts) for j in range(k)],
                                           dtype=torch.int32),
        bonus_logits_indices=torch.tensor(ends - 1, dtype=torch.int32),
        logits_indices=torch.arange(int(ends[-1]), dtype=torch.int32))


def processor(cls, params):
    """vLLM's builtin logits processor ``cls`` holding one SamplingParams per batch row."""
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(params)))
    proc = cls(config, torch.device("cpu"), False)
    proc.update_state(BatchUpdate(batch_size=len(params), removed=[], moved=[],
                                  added=[(i, p, None, []) for i, p in enumerate(params)]))
    return proc


def sampling_metadata(n, vocab, temperature=None, top_k=None, top_p=None, min_p=None, logit_bias=None,
                      generators=None, processors=(), max_num_logprobs=None):
    """SamplingMetadata of ``n`` requests, as vLLM's input batch fills it: temperature None when
    all are greedy (0 marks a greedy row), top_k the vocabulary size where off (None when off
    everywhere), min-p and logit bias held by their processors."""
    temperature = None if temperature is None else torch.as_tensor(temperature, dtype=torch.float32)
    if temperature is not None and not bool((temperature == 0).all()):
        all_greedy, all_random = False, bool((temperature > 0).all())
    else:
        temperature, all_greedy, all_random = None, True, False
    if top_k is not None:
        top_k = torch.as_tensor(top_k, dtype=torch.int32)
        top_k = torch.where(top_k == 0, vocab, top_k).to(torch.int32)
    procs = list(processors)
    if min_p is not None:
        procs.append(processor(MinPLogitsProcessor, [SamplingParams(min_p=float(m)) for m in min_p]))
    if logit_bias is not None:
        procs.append(processor(LogitBiasLogitsProcessor, [SamplingParams(logit_bias=b) for b in logit_bias]))
    return SamplingMetadata(
        temperature=temperature, all_greedy=all_greedy, all_random=all_random,
        top_p=None if top_p is None else torch.as_tensor(top_p, dtype=torch.float32), top_k=top_k,
        generators=generators or {}, max_num_logprobs=max_num_logprobs, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n), presence_penalties=torch.zeros(n), repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(procs))


def filtered_probs(logits, temperature, top_k=None, top_p=None, min_p=None):
    """The distribution vLLM's sampler samples each row of ``logits`` from without speculation
    (temperature, then min-p, then top-k, then top-p over what is left; per-row parameters,
    top_k 0 or None off), computed with vLLM's own top-k/top-p function."""
    rows, vocab = logits.shape
    scaled = logits.double() / torch.as_tensor(temperature, dtype=torch.float64).reshape(rows, 1)
    if min_p is not None:
        p = scaled.softmax(-1)
        keep = p >= p.amax(-1, keepdim=True) * torch.as_tensor(min_p, dtype=torch.float64).reshape(rows, 1)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    k = None if top_k is None else torch.where(torch.as_tensor(top_k) == 0, vocab, torch.as_tensor(top_k)).long()
    p = None if top_p is None else torch.as_tensor(top_p, dtype=torch.float64)
    return apply_top_k_top_p(scaled, k, p).softmax(-1)


def pooled_pvalue(observed, probs):
    """Chi-squared p-value of counts against ``probs`` (normalised here), the cells expecting fewer
    than 5 counts pooled into one: the test's approximation fails on such cells (a count of 4 where
    0.2 is expected alone reads as p ~ 1e-10)."""
    probs = probs.double() / probs.double().sum()
    expected = probs * observed.sum()
    assert observed[probs == 0].sum() == 0, "a token outside the filtered support was emitted"
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    return chisquare(obs[keep].numpy(), exp[keep].numpy()).pvalue
