"""xPress as a vLLM proposer: the shipped block drafter with :func:`xkernels.jacobi_refine`,
verified by :class:`xkernels.integrations.vllm.XKernelsRejectionSampler`.

Use it as vLLM's ``custom_class`` proposer, with the plugin on (``XKERNELS_VLLM=1``) and prefix
caching off::

    LLM(model=<the shipped target exported by `python -m xkernels export-hf`>, enable_prefix_caching=False,
        speculative_config={"method": "custom_class", "num_speculative_tokens": 7,
                            "model": "xkernels.integrations.vllm_xpress.XPressProposer"})

vLLM 0.32 calls a ``custom_class`` proposer with token ids only, while the drafter reads the
target's hidden states (``cfg.target_layers``) and a lossless sampled proposal has to hand the
sampler its draft distribution. :func:`install` (run by the plugin) therefore lets the V1 model
runner (1) ask the target for the hidden states of those layers (vLLM's EAGLE-3 auxiliary outputs,
``set_aux_hidden_state_layers``) and (2) call :meth:`XPressProposer.propose_in_runner` with them,
storing the draft probabilities where the runner hands them to the rejection sampler
(``_draft_probs``, the path of vLLM's draft-model proposers). The proposal is the one of
:class:`xkernels.decoding.modes.JacobiProposer` in our own loop: greedy requests get the argmax
Jacobi iterate, sampled ones the drafts that are proper samples of the refined distribution q
(the settled prefix) together with q, so the output follows the target's distribution at T > 0.
Each engine step drafts the blocks of all its requests in one drafter pass (:meth:`XPressProposer.blocks`),
each block's noise keyed by its request's seed and anchor position, so a request's drafts do not
depend on the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..decoding.modes import JacobiProposer, Streams, draft_block, request_seeds
from ..models import shipped
from ..models.static_cache import StaticKVCache
from ..models.target import KVCache

_SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy
_DRAFT_SALT = 0x5851_7CE5_D7AF_7A11  # the drafts' seed differs from the verification's (independent noise)


@dataclass
class _Request:
    context: KVCache  # the drafter's injected keys and values of the committed positions
    seed: int  # of the drafts' noise (sampled requests)
    complete: bool = True  # every committed position's features were seen (not so after a prefix-cache hit)


class XPressProposer:
    """vLLM ``custom_class`` proposer: the shipped drafter's block, refined by ``jacobi_refine``.

    Args:
        vllm_config: vLLM's ``VllmConfig``; ``speculative_config.num_speculative_tokens`` drafts
            per step (at most the drafter's block size - 1).

    Raises:
        ValueError: prefix caching on (a cached prefix is never run through the target, so the
            drafter would lack its hidden states), or a drafter too small for the draft count.
    """

    iters = 4  # Jacobi passes per block (xkernels.generate's default)

    def __init__(self, vllm_config):
        if vllm_config.cache_config.enable_prefix_caching:
            raise ValueError("XPressProposer needs enable_prefix_caching=False: the drafter reads the target's "
                             "hidden states of every position, which a cached prefix never computes")
        models = shipped.load_all()
        self.target, self.drafter = models.target, models.drafter
        self.num_drafts = vllm_config.speculative_config.num_speculative_tokens
        if not 0 < self.num_drafts < self.drafter.cfg.block_size:
            raise ValueError(f"num_speculative_tokens must be in [1, {self.drafter.cfg.block_size - 1}] for the "
                             f"shipped drafter (block size {self.drafter.cfg.block_size}), got {self.num_drafts}")
        # Only the slots vLLM verifies are refined (the refiner is causal: the same drafts there).
        self.proposer = JacobiProposer(models.refiner, self.iters, slots=self.num_drafts)
        # vLLM's auxiliary layer i is the residual stream entering decoder layer i, i.e. the output
        # of layer i - 1, which is what TargetLM's hidden_layers index.
        self.aux_layers = tuple(i + 1 for i in self.drafter.cfg.target_layers)
        self.requests: dict[str, _Request] = {}

    def load_model(self, model) -> None:
        """vLLM's hook with the target it serves: refuses one that is not the shipped target."""
        ids = torch.arange(min(64, self.target.cfg.vocab_size))
        with torch.inference_mode():
            embed, ours = model.embed_input_ids(ids.to(next(model.parameters()).device)), self.target.embed(ids)
        if embed.shape != ours.shape or not torch.allclose(embed.float().cpu(), ours, atol=1e-3):
            raise ValueError("XPressProposer drafts for the shipped target only (python -m xkernels export-hf); "
                             "vLLM serves another model")

    def propose(self, *args, **kwargs):
        raise RuntimeError("XPressProposer needs the xkernels plugin in the model runner (set XKERNELS_VLLM=1): "
                           "vLLM's custom_class call gives a proposer no hidden states")

    def propose_in_runner(self, runner, scheduler_output, sampled: list[list[int]], aux_hidden_states,
                          spec_decode_metadata) -> tuple[list[list[int]], torch.Tensor | None]:
        """The drafts of every request of the batch just verified, and their probabilities.

        Args:
            runner: vLLM's V1 model runner (its input batch, requests and positions of this step).
            scheduler_output: the step's ``SchedulerOutput``.
            sampled: the tokens each request emitted this step (empty: a partial prefill).
            aux_hidden_states: the target's states at ``self.aux_layers``, ``[tokens, dim]`` each.
            spec_decode_metadata: the step's ``SpecDecodeMetadata``, or None (no drafts verified).

        Returns:
            (drafts per request, float32 ``[N, K, V]`` draft probabilities, or None when no
            sampled request drafted): a greedy request's rows are its drafts' point masses.
        """
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        batch = runner.input_batch
        total = scheduler_output.total_num_scheduled_tokens
        features = torch.cat([h[:total] for h in aux_hidden_states], dim=-1)
        positions = runner.positions[:total].cpu()
        position_of = positions.tolist()
        num_drafts = [0] * len(batch.req_ids) if spec_decode_metadata is None else spec_decode_metadata.num_draft_tokens
        committed, drafting, row = [], [], 0
        for i, req_id in enumerate(batch.req_ids):
            scheduled = scheduler_output.num_scheduled_tokens.get(req_id, 0)
            # The anchor and the accepted drafts of a step are committed, the rejected ones not.
            kept = scheduled - (num_drafts[i] - (len(sampled[i]) - 1) if sampled[i] else 0)
            state = self._state(req_id, runner.requests[req_id].sampling_params.seed)
            if scheduled and self._continues(state, position_of[row]):
                committed.append((state, features[row : row + kept], positions[row : row + kept]))
            row += scheduled
            if sampled[i] and state.complete:
                drafting.append((i, state))
        self._commit(committed)
        drafts, probs = [[] for _ in batch.req_ids], [None] * len(batch.req_ids)
        if drafting:
            rows = [i for i, _ in drafting]
            states = [state for _, state in drafting]
            params = [runner.requests[batch.req_ids[i]].sampling_params for i in rows]
            # The token before the anchor, which sits at the context's length.
            prevs = [int(batch.token_ids_cpu[i, state.context.length - 1]) for i, state in drafting]
            blocks = self.blocks([state.context for state in states], [sampled[i][-1] for i in rows], prevs,
                                 [0.0 if p.temperature < _SAMPLING_EPS else p.temperature for p in params],
                                 request_seeds([state.seed for state in states], len(states)))
            for i, (tokens, q) in zip(rows, blocks):
                drafts[i], probs[i] = tokens, q
        return drafts, self._probs(drafts, probs)

    def _state(self, req_id, seed) -> _Request:
        """A request's drafting state (made when it first appears, with its drafts' seed)."""
        state = self.requests.get(req_id)
        if state is None:
            seed = int(torch.randint(-(1 << 63), (1 << 63) - 1, ())) if seed is None else seed
            state = self.requests[req_id] = _Request(KVCache(len(self.drafter.layers)), seed ^ _DRAFT_SALT)
        return state

    @staticmethod
    def _continues(state, first_position) -> bool:
        """Whether a step whose tokens start at ``first_position`` extends the request's context."""
        if first_position < state.context.length:  # recomputed (after a preemption): committed states do not change
            state.context.crop(first_position)
        elif first_position > state.context.length:
            state.complete = False
        return state.complete

    @torch.inference_mode()
    def _commit(self, committed) -> None:
        """Appends the drafter's keys and values of newly committed positions, for every request
        of ``committed`` (state, target features ``[t, F]``, positions ``[t]``) in one call."""
        if not committed:
            return
        features = torch.cat([f for _, f, _ in committed]).float().cpu()
        positions = torch.cat([p for _, _, p in committed]).long()
        counts = [f.shape[0] for _, f, _ in committed]
        for layer, (k, v) in enumerate(self.drafter.context(features[None], positions)):
            for (state, _, _), k_i, v_i in zip(committed, k.split(counts, 2), v.split(counts, 2)):
                state.context.append(layer, k_i, v_i)

    @torch.inference_mode()
    def blocks(self, contexts: list[KVCache], anchors: list[int], prevs: list[int], temperatures: list[float],
               seeds: torch.Tensor) -> list[tuple[list[int], torch.Tensor | None]]:
        """The drafts of N blocks, each after its own context, in one drafter pass (the contexts
        padded to the longest, each block seeing its own positions: ``draft_block``'s ``ctx_len``)
        and at most two refinements of the first ``num_drafts`` slots (the greedy blocks; the
        sampled ones, each at its own temperature). Block n's noise is keyed by (seeds[n], its
        anchor's position) only
        (:class:`xkernels.decoding.modes.Streams`' per-request form), so its drafts do not depend
        on the rest of the batch.

        Args:
            contexts: per block, the drafter's keys and values of the positions before its anchor.
            anchors, prevs: per block, the anchor and the token before it.
            temperatures: per block, 0 (greedy) or the request's temperature.
            seeds: int64 ``[N]``, each block's seed of its drafts' noise.

        Returns:
            per block, (drafts, their q ``[k, V]`` or None at T = 0): at most ``num_drafts``, and at
            T > 0 only those that are samples of q (the prefix where Jacobi settled).
        """
        lengths = torch.tensor([c.length for c in contexts])
        padded = StaticKVCache.for_model(self.drafter.cfg.attention_config(), len(contexts), int(lengths.max()),
                                         torch.float32, "cpu", n_layers=len(self.drafter.layers))
        for i, context in enumerate(contexts):
            padded.load(i, context.k, context.v)
        anchors = torch.tensor(anchors)
        base_logits, h = draft_block(self.drafter, self.target, anchors, padded.keys_values(), torch.float32,
                                     ctx_len=lengths)
        prefix = torch.stack([torch.tensor(prevs), anchors], 1)
        out = [None] * len(contexts)
        for greedy in (True, False):  # the greedy blocks, then the sampled ones at their temperatures
            rows = torch.tensor([i for i, t in enumerate(temperatures) if (t == 0) == greedy], dtype=torch.int64)
            if len(rows) == 0:
                continue
            temperature = 0.0 if greedy else torch.tensor([temperatures[i] for i in rows.tolist()])
            p = self.proposer.propose(base_logits[rows], h[rows], prefix[rows],
                                      Streams(temperature, seeds[rows], lengths[rows]))
            limits = [self.num_drafts] * len(rows) if p.limit is None else p.limit.clamp(max=self.num_drafts).tolist()
            for j, (i, k) in enumerate(zip(rows.tolist(), limits)):
                out[i] = (p.drafts[j, :k].tolist(), None if p.q is None else p.q[j, :k])
        return out

    def _probs(self, drafts, probs):
        if all(q is None for q in probs):
            return None
        out = torch.zeros(len(drafts), max(map(len, drafts)), self.target.cfg.vocab_size)
        for i, (tokens, q) in enumerate(zip(drafts, probs)):
            if q is not None:
                out[i, : len(tokens)] = q
            elif tokens:  # a deterministic proposal's distribution
                out[i, torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return out


def install(runner_module) -> None:
    """Lets vLLM's V1 model runner run :class:`XPressProposer` with what it needs.

    ``_setup_eagle3_aux_hidden_state_outputs`` then asks the target for the drafter's layers, and
    ``propose_draft_token_ids`` calls :meth:`XPressProposer.propose_in_runner` with them and keeps
    the draft probabilities for the rejection sampler. Other proposers are left as they are.

    Args:
        runner_module: the module ``vllm.v1.worker.gpu_model_runner``.
    """
    runner = runner_module.GPUModelRunner
    if getattr(runner.propose_draft_token_ids, "_xkernels", False):
        return
    setup, propose = runner._setup_eagle3_aux_hidden_state_outputs, runner.propose_draft_token_ids

    def _setup_eagle3_aux_hidden_state_outputs(self):
        drafter = getattr(self, "drafter", None)
        if isinstance(drafter, XPressProposer):
            self.use_aux_hidden_state_outputs = True
            setup(self)  # checks that the model has the interface
            self.model.set_aux_hidden_state_layers(drafter.aux_layers)
        else:
            setup(self)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata, *args, **kwargs):
        if not isinstance(getattr(self, "drafter", None), XPressProposer):
            return propose(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                           sample_hidden_states, aux_hidden_states, spec_decode_metadata, *args, **kwargs)
        drafts, probs = self.drafter.propose_in_runner(self, scheduler_output, sampled_token_ids, aux_hidden_states,
                                                       spec_decode_metadata)
        self._draft_probs = None if probs is None else probs.to(self.device)
        self._draft_prob_req_ids = None if probs is None else self.input_batch.req_ids.copy()
        return drafts

    propose_draft_token_ids._xkernels = True
    runner._setup_eagle3_aux_hidden_state_outputs = _setup_eagle3_aux_hidden_state_outputs
    runner.propose_draft_token_ids = propose_draft_token_ids
