"""ctypes bindings of the CUDA emulation library (build.sh): the real CUDA launchers, run on the
CPU, called with torch CPU tensors. Each call raises EmuViolation if the kernels broke a CUDA
rule the emulation checks, and returns what the kernels wrote."""
import collections
import contextlib
import ctypes
import os

import torch

LOGITS_TYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
WEIGHT_TYPES = {torch.float32: 0, torch.bfloat16: 1}
REFINE_OPS = {"refine_step": 0, "jacobi_refine": 1, "sequential_refine": 2}
READ_MODES = {"auto": 0, "gemm": 1, "fused": 2}  # RefineReadMode
# refine_read_plan's RefineReadPlan, field by field
RefinePlan = collections.namedtuple("RefinePlan", "fused partials chunk chunks chunks_per_slice slice slices m_tiles "
                                                  "groups blocks tiles smem_bytes")


class EmuViolation(AssertionError):
    pass


class LaunchError(RuntimeError):
    pass


def _ptr(t):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _c(t):
    return None if t is None else t.contiguous()


def _probs_type(q):
    """The launchers' q_dtype of draft probabilities (float32 where there are none)."""
    return ctypes.c_int(LOGITS_TYPES[torch.float32 if q is None else q.dtype])


def _inv_t(temperature):
    return 0.0 if temperature == 0 else 1.0 / temperature


def _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset):
    """The shims' sampling arguments (scalars, per-row arrays, the stream) as xkernels' wrappers
    take them (per-row values as [N] tensors, per-row seeds and offsets as int64 [N] tensors),
    and whether some row may sample and some may filter (the host's view of them)."""
    from xkernels.reference.rng import inverse_temperature
    from xkernels.reference.sampling import is_per_row

    def rows(x, dtype):
        return x.to(dtype).contiguous() if isinstance(x, torch.Tensor) else None

    def scalar(x, default):
        return default if x is None or isinstance(x, torch.Tensor) else x

    def stream(x):
        if isinstance(x, torch.Tensor):
            x = x.to(torch.int64).reshape(-1).contiguous()
            return 0, x, x.numel()
        return x % 2**64, None, 0

    if isinstance(top_k, torch.Tensor):  # as the bindings narrow int64: past int32 clamped, not wrapped
        top_k = top_k.clamp(-2**31, 2**31 - 1)
    temp_rows, k_rows, p_rows, m_rows = (rows(temperature, torch.float32), rows(top_k, torch.int32),
                                         rows(top_p, torch.float32), rows(min_p, torch.float32))
    seed_int, seed_t, seed_numel = stream(seed)
    offset_int, offset_t, offset_numel = stream(offset)
    per_request = is_per_row(seed, n) or is_per_row(offset, n)
    inv_t, k, p, mp = (inverse_temperature(scalar(temperature, 0.0)), min(scalar(top_k, 0), 2**31 - 1),
                       scalar(top_p, 1.0), scalar(min_p, 0.0))
    may_sample = temp_rows is not None or inv_t != 0
    filtered = may_sample and (any(x is not None for x in (k_rows, p_rows, m_rows)) or 0 < k < v or p < 1 or mp > 0)
    args = (ctypes.c_float(inv_t), ctypes.c_int32(k), ctypes.c_float(p), ctypes.c_float(mp), _ptr(temp_rows),
            _ptr(k_rows), _ptr(p_rows), _ptr(m_rows), ctypes.c_uint64(seed_int), ctypes.c_uint64(offset_int),
            _ptr(seed_t), ctypes.c_int64(seed_numel), _ptr(offset_t), ctypes.c_int64(offset_numel),
            ctypes.c_int(per_request))
    # the arrays must live through the call: the tuple holds them
    return args, (temp_rows, k_rows, p_rows, m_rows, seed_t, offset_t, may_sample, filtered)


class CudaEmu:
    def __init__(self, path=None):
        self.lib = ctypes.CDLL(path or os.environ["XK_CUDA_EMU_LIB"])
        self.lib.xk_emu_chain_verify.restype = ctypes.c_int
        self.lib.xk_emu_refine.restype = ctypes.c_int

    def take_row_passes(self):
        """The passes over a row the kernels started since the last call (XK_ROW_PASS, once a block)."""
        self.lib.xk_emu_take_row_passes.restype = ctypes.c_uint64
        return self.lib.xk_emu_take_row_passes()

    def take_cluster_launches(self):
        """The grids launched in clusters of 2+ blocks since the last call."""
        self.lib.xk_emu_take_cluster_launches.restype = ctypes.c_uint64
        return self.lib.xk_emu_take_cluster_launches()

    def _check(self, rc, message):
        text = message.value.decode()
        if rc == -1:
            raise EmuViolation(text)
        if rc != 0:
            raise LaunchError(f"launch failed with cudaError {rc}")

    def chain_verify(self, drafts, logits, q=None, temperature=0.0, seed=0, offset=0, num_sms=4,
                     seed_tensor=None, offset_tensor=None):
        n, k1, v = logits.shape
        drafts, logits, q = _c(drafts), _c(logits), _c(q)
        accept_len = torch.empty(n, dtype=torch.int64)
        out = torch.empty(n, k1, dtype=torch.int64)
        msg = ctypes.create_string_buffer(1024)
        rc = self.lib.xk_emu_chain_verify(
            _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(drafts), _ptr(q), _probs_type(q), ctypes.c_int64(n),
            ctypes.c_int64(k1 - 1),
            ctypes.c_int64(v), ctypes.c_float(_inv_t(temperature)), ctypes.c_uint64(seed % 2**64),
            ctypes.c_uint64(offset % 2**64), _ptr(seed_tensor), _ptr(offset_tensor), ctypes.c_int(num_sms),
            _ptr(accept_len), _ptr(out), msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return accept_len, out

    def chain_verify_ragged(self, drafts, cu, logits, max_spec_len, q=None, temperature=0.0, top_k=None, top_p=None,
                            min_p=None, seed=0, offset=0, method="token", logprobs=True, errors=None):
        """chain_verify_ragged_'s kernel, with the arguments as xkernels.chain_verify_ragged takes
        them (per-row values as [N] tensors, per-row seeds and offsets as int64 [N] tensors);
        logprobs=False passes no log-probability buffer (None comes back); errors: an int32 [N]
        tensor the kernel ORs each request's error bits into (in place)."""
        n, v = cu.shape[0], logits.shape[-1]
        t = drafts.shape[0]
        sampling, _held = _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset)
        drafts, cu, logits, q = _c(drafts.to(torch.int64)), _c(cu.to(torch.int64)), _c(logits), _c(q)
        out = torch.empty(n, max_spec_len + 1, dtype=torch.int32)
        emitted = torch.empty(n, dtype=torch.int32)
        logprobs = torch.empty(n, max_spec_len + 1) if logprobs else None
        msg = ctypes.create_string_buffer(1024)
        self.lib.xk_emu_chain_ragged.restype = ctypes.c_int
        rc = self.lib.xk_emu_chain_ragged(
            _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(drafts), _ptr(cu), _ptr(q), _probs_type(q), ctypes.c_int64(t),
            ctypes.c_int64(n), ctypes.c_int64(v), ctypes.c_int64(max_spec_len), *sampling,
            ctypes.c_int(method == "block"), _ptr(out), _ptr(emitted), _ptr(logprobs), _ptr(errors), msg,
            ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return out, emitted, logprobs

    @contextlib.contextmanager
    def filter_order(self, order):
        """The kernels launched inside apply the filters in `order` (an op's filter_order:
        "min_p_first" is vLLM's), whatever the launcher."""
        from xkernels.reference.sampling import check_filter_order

        self.lib.xk_emu_set_min_p_first(ctypes.c_int(check_filter_order(order)))
        try:
            yield
        finally:
            self.lib.xk_emu_set_min_p_first(ctypes.c_int(0))

    def row_cut(self, logits, temperature=0.0, top_k=None, top_p=None, min_p=None, rows_per_request=1):
        """launch_row_cut over the rows of `logits` ([rows, V], rows of any stride), parameters as
        chain_verify_ragged takes them (per-request values as [rows / rows_per_request] tensors).
        Returns the cuts' values (float32 [rows]) and ids (int32 [rows])."""
        rows, v = logits.shape
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        sampling, held = _sampling_args(rows, v, temperature, top_k, top_p, min_p, 0, 0)
        requests = max([x.numel() for x in held[:4] if x is not None], default=0)
        cuts = torch.empty(rows, 2, dtype=torch.int32)
        msg = ctypes.create_string_buffer(1024)
        self.lib.xk_emu_row_cut.restype = ctypes.c_int
        rc = self.lib.xk_emu_row_cut(
            _ptr(logits), LOGITS_TYPES[logits.dtype], ctypes.c_int64(rows), ctypes.c_int64(v),
            ctypes.c_int64(logits.stride(0) if rows > 1 else v), ctypes.c_int64(rows_per_request),
            ctypes.c_int64(requests), *sampling[:8], _ptr(cuts), msg, ctypes.c_size_t(len(msg)))  # no stream
        self._check(rc, msg)
        return cuts[:, 0].view(torch.float32), cuts[:, 1].clone()

    def refine(self, op, ctx, tokens, base, weights, temperature=0.0, seed=0, offset=0, max_iters=0, num_sms=4,
               slice_bytes=1 << 20, read="auto", seed_tensor=None, offset_tensor=None, top_k=None, top_p=None,
               min_p=None, pick_only=False):
        """pick_only: every filtered row by filtered_pick_kernel alone (RefineParams). slice_bytes: the byte budget of one GEMM slice of the read (the binding passes 1 GiB or a
        sixteenth of the device memory; small values: many slices); read: the read's mode
        (XKERNELS_REFINE_READ: auto, gemm or fused). temperature, top_k, top_p, min_p: scalars
        (None: off) or [N] tensors; seed, offset: ints, or tensors as xkernels.refine_step takes them (seed_tensor / offset_tensor: the older spelling of a
        one-element tensor)."""
        n, b, r = ctx.shape
        seed = seed if seed_tensor is None else seed_tensor
        offset = offset if offset_tensor is None else offset_tensor
        d, v = base.shape[1], base.shape[2]
        sampling, _held = _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset)
        h = weights.w_gate.shape[0]
        w = [_c(x) for x in (weights.emb, weights.mix, weights.w_gate, weights.w_up, weights.w_down, weights.w_read)]
        ctx, tokens, base = _c(ctx), _c(tokens), _c(base)
        out_tokens = torch.empty(n, d, dtype=torch.int64)
        out_logprobs = torch.empty(n, d, dtype=torch.float32)
        iters = torch.empty(n, dtype=torch.int32)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_refine(
            ctypes.c_int(REFINE_OPS[op]), _ptr(ctx), _ptr(tokens), i64(tokens.shape[1]), _ptr(base),
            LOGITS_TYPES[base.dtype], *[_ptr(x) for x in w], WEIGHT_TYPES[w[0].dtype], i64(n), i64(b), i64(d), i64(r),
            i64(h), i64(v), *sampling, i64(max_iters), ctypes.c_int(num_sms), i64(slice_bytes),
            ctypes.c_int(READ_MODES[read]), ctypes.c_int(int(pick_only)), _ptr(out_tokens), _ptr(out_logprobs), _ptr(iters), msg,
            ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return out_tokens, out_logprobs, iters

    def refine_plan(self, n, b, d, r, h, v, rows, read=True, weight_dtype=torch.float32, num_sms=132,
                    slice_bytes=20 << 20, mode="auto", cc_major=9, w_read_offset=0):
        """The CUDA binding's planning of the refine read for `rows` rows (a RefinePlan) and the
        op's workspace bytes. w_read_offset: bytes w_read lies past a 256-byte aligned address."""
        plan = (ctypes.c_int64 * len(RefinePlan._fields))()
        workspace = ctypes.c_uint64()
        i64 = ctypes.c_int64
        self.lib.xk_emu_refine_plan(i64(n), i64(b), i64(d), i64(r), i64(h), i64(v), ctypes.c_int(WEIGHT_TYPES[weight_dtype]),
                                    ctypes.c_int(num_sms), i64(slice_bytes), ctypes.c_int(READ_MODES[mode]),
                                    ctypes.c_int(cc_major), i64(w_read_offset), i64(rows), ctypes.c_int(read), plan,
                                    ctypes.byref(workspace))
        return RefinePlan(*plan), workspace.value

    def build_draft_tree(self, lp, tok, budget, mask=None):
        """(tokens, parents, num_nodes, depth), and with mask ("bool" or "packed") the mask the same
        launch writes, as xkernels.build_draft_tree takes and returns them."""
        n, d, k = lp.shape
        lp, tok = _c(lp), _c(tok)
        m = budget + 1
        out = [torch.empty(n, m, dtype=torch.int64) for _ in range(3)] + [torch.empty(n, dtype=torch.int64)]
        packed = mask == "packed"
        tree_mask = None if mask is None else torch.empty(n, m, (m + 7) // 8 if packed else m,
                                                          dtype=torch.uint8 if packed else torch.bool)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_build_draft_tree(_ptr(lp), _ptr(tok), i64(n), i64(d), i64(k), i64(budget),
                                              *[_ptr(t) for t in out], _ptr(tree_mask), ctypes.c_int(packed), msg,
                                              ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        tokens, parents, depth, num_nodes = out
        return (tokens, parents, num_nodes, depth) + (() if mask is None else (tree_mask,))

    def tree_mask(self, parents, num_nodes=None, packed=False, positions=False):
        n, m = parents.shape
        parents, num_nodes = _c(parents), _c(num_nodes)
        if positions:
            out = torch.empty(n, m, dtype=torch.int64)
        else:
            out = torch.empty(n, m, (m + 7) // 8 if packed else m, dtype=torch.uint8 if packed else torch.bool)
        msg = ctypes.create_string_buffer(1024)
        rc = self.lib.xk_emu_tree_mask(_ptr(parents), _ptr(num_nodes), ctypes.c_int64(n), ctypes.c_int64(m),
                                       ctypes.c_int(packed), ctypes.c_int(positions), _ptr(out), msg,
                                       ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return out

    def tree_verify(self, tokens, parents, logits, q=None, without_replacement=False, temperature=0.0, seed=0,
                    offset=0, num_nodes=None, num_sms=4, max_smem=227 * 1024, top_k=None, top_p=None, min_p=None,
                    clusters=True):
        """max_smem: the shared memory a block may opt into (an H100's by default; 0: 48 KB); clusters:
        the device runs thread block clusters (the binding's test of sm_90+). The sampling arguments
        as xkernels.tree_verify takes them."""
        n, m, v = logits.shape
        sampling, held = _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset)
        may_sample, filtered = held[-2:]
        tokens, parents, logits, q, num_nodes = _c(tokens), _c(parents), _c(logits), _c(q), _c(num_nodes)
        accept_len = torch.empty(n, dtype=torch.int64)
        path = torch.empty(n, m, dtype=torch.int64)
        out = torch.empty(n, m, dtype=torch.int64)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_tree_verify(
            _ptr(tokens), _ptr(parents), _ptr(num_nodes), _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(q),
            _probs_type(q), ctypes.c_int(without_replacement), i64(n), i64(m), i64(v), *sampling,
            ctypes.c_int(may_sample), ctypes.c_int(filtered), ctypes.c_int(num_sms), ctypes.c_int(max_smem),
            ctypes.c_int(clusters), _ptr(accept_len), _ptr(path), _ptr(out), msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return accept_len, path, out

    def compact_kv(self, cache, path, accept_len, prefix_len):
        cache = cache.contiguous().clone()
        n, h, length, d = cache.shape
        path, accept_len = _c(path), _c(accept_len)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_compact_kv(_ptr(cache), i64(n), i64(h), i64(length), i64(d), i64(cache.element_size()),
                                        _ptr(path), _ptr(accept_len), i64(path.shape[1]), i64(prefix_len), msg,
                                        ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return cache

    def dllm_step(self, logits, block, mask_id, num_unmask=1, threshold=None, temperature=0.0, seed=0, offset=0,
                  num_sms=4, top_k=None, top_p=None, min_p=None, radix_only=False):
        """temperature, top_k, top_p, min_p: scalars or [N]; seed, offset: ints or int64 tensors (one
        element or [N]); radix_only: every filtered row by dllm_filtered_kernel (DllmParams)."""
        n, length, v = logits.shape
        logits, block = _c(logits), _c(block)
        outs = [torch.empty(n, length, dtype=torch.int64) for _ in range(3)] + [torch.empty(n, length)]
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        stream, _alive = _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset)
        rc = self.lib.xk_emu_dllm_step(
            _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(block), i64(n), i64(length), i64(v), i64(mask_id),
            i64(num_unmask), ctypes.c_int(threshold is not None), ctypes.c_float(threshold or 0.0), *stream,
            ctypes.c_int(num_sms), ctypes.c_int(radix_only), *[_ptr(t) for t in outs], msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return tuple(outs)

    def param_errors(self, errors, temperature=0.0, top_k=None, top_p=None, min_p=None):
        """param_errors_kernel over errors' N rows: ORs each row's bits of the per-row values ([N]
        tensors, or scalars, which have none) into errors (int32 [N], in place); returns it."""
        n = errors.shape[0]
        stream, _alive = _sampling_args(n, 1, temperature, top_k, top_p, min_p, 0, 0)
        msg = ctypes.create_string_buffer(1024)
        rc = self.lib.xk_emu_param_errors(ctypes.c_int64(n), *stream, _ptr(errors), msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return errors

    def spiffy_materialize(self, logits, block, mask_id, graph, keep, temperature=0.0, num_sms=4, top_k=None,
                           top_p=None, min_p=None):
        n, length, v = logits.shape
        logits, block = _c(logits), _c(block)
        ranks, ptr, children = _c(graph.ranks), _c(graph.child_ptr), _c(graph.children)
        drafts = torch.empty(n, keep, length, dtype=torch.int64)
        node_ids = torch.empty(n, keep, dtype=torch.int64)
        scores = torch.empty(n, keep)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        stream, _alive = _sampling_args(n, v, temperature, top_k, top_p, min_p, 0, 0)
        rc = self.lib.xk_emu_spiffy_materialize(
            _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(block), i64(n), i64(length), i64(v), i64(mask_id),
            _ptr(ranks), _ptr(ptr), _ptr(children), i64(ranks.shape[0]), i64(ranks.shape[1]), i64(children.numel()),
            i64(keep), *stream, ctypes.c_int(num_sms), _ptr(drafts), _ptr(node_ids), _ptr(scores), msg,
            ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return drafts, node_ids, scores

    def spiffy_accept(self, root, draft_logits, drafts, node_ids, block, mask_id, num_unmask=1, threshold=None,
                      temperature=0.0, seed=0, offset=0, clusters=True, top_k=None, top_p=None, min_p=None,
                      radix_only=False):
        """clusters: the device runs thread block clusters (the binding's test of sm_90+); radix_only:
        every filtered row by dllm_filtered_pick (SpiffyAcceptParams)."""
        n, length, v = root.shape
        k = drafts.shape[1]
        root, draft_logits, drafts, node_ids, block = map(_c, (root, draft_logits, drafts, node_ids, block))
        num_steps, continue_from = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        positions, tokens, new_block = (torch.empty(n, length, dtype=torch.int64) for _ in range(3))
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        stream, _alive = _sampling_args(n, v, temperature, top_k, top_p, min_p, seed, offset)
        rc = self.lib.xk_emu_spiffy_accept(
            _ptr(root), _ptr(draft_logits), LOGITS_TYPES[root.dtype], _ptr(drafts), _ptr(node_ids), _ptr(block),
            i64(n), i64(length), i64(v), i64(k), i64(mask_id), i64(num_unmask), ctypes.c_int(threshold is not None),
            ctypes.c_float(threshold or 0.0), *stream, ctypes.c_int(clusters), ctypes.c_int(radix_only), _ptr(num_steps), _ptr(positions),
            _ptr(tokens), _ptr(new_block), _ptr(continue_from), msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return num_steps, positions, tokens, new_block, continue_from

    def spiffy_accept_plan(self, n, length, clusters=True):
        """(blocks a sequence, workspace bytes) as the binding plans spiffy_accept."""
        blocks, size = ctypes.c_uint(), ctypes.c_size_t()
        self.lib.xk_emu_spiffy_accept_plan(ctypes.c_int64(n), ctypes.c_int64(length), ctypes.c_int(clusters),
                                           ctypes.byref(blocks), ctypes.byref(size))
        return blocks.value, size.value

    def spiffy_attention_mask(self, prefix_lens, num_drafts, block_size, max_prefix_len, packed=False):
        n = prefix_lens.shape[0]
        q = (1 + num_drafts) * block_size
        keys = max_prefix_len + q
        mask = torch.empty(n, q, (keys + 7) // 8 if packed else keys, dtype=torch.uint8)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        prefix_lens = _c(prefix_lens)  # a copy passed as _ptr(_c(x)) would be freed before the call reads it
        rc = self.lib.xk_emu_spiffy_attention_mask(_ptr(prefix_lens), i64(n), i64(num_drafts), i64(block_size),
                                                   i64(max_prefix_len), ctypes.c_int(packed), _ptr(mask), msg,
                                                   ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return mask if packed else mask.bool()

    def gumbel_gate_check(self, w, best, words, linear=False):
        """(skips, errors) of sampling.h's gumbel_cannot_win over words [pairs, per_pair] (int64 holding
        uint32 values) for log weights w [pairs] (linear: weights, gumbel_cannot_win_linear) and best
        scores best [pairs], float32."""
        w, best = _c(w.float()), _c(best.float())
        words = _c(words.to(torch.int64).to(torch.int32))  # the same 32 bits, read as uint32
        skips, errors = ctypes.c_int64(), ctypes.c_int64()
        self.lib.xk_emu_gumbel_gate_check(_ptr(w), _ptr(best), _ptr(words), ctypes.c_int64(words.shape[0]),
                                          ctypes.c_int64(words.shape[1]), ctypes.c_int(int(linear)),
                                          ctypes.byref(skips), ctypes.byref(errors))
        return skips.value, errors.value

    def shard_cut_histogram(self, logits, scale, prefix, shift, vocab_start, ignore_id=-1, row_max=None,
                            keep_value=None, keep_id=None):
        r, v = logits.shape
        logits, scale, prefix = _c(logits), _c(scale.float()), _c(prefix.long())
        row_max = None if row_max is None else _c(row_max.float())
        keep_value = None if keep_value is None else _c(keep_value.float())
        keep_id = None if keep_id is None else _c(keep_id.clamp(-(2**31), 2**31 - 1).to(torch.int32))
        out = torch.empty(r, 2, 256, dtype=torch.int64)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_shard_cut_histogram(
            _ptr(logits), LOGITS_TYPES[logits.dtype], i64(r), i64(v), i64(vocab_start), i64(ignore_id), _ptr(scale),
            _ptr(prefix), ctypes.c_int(shift), _ptr(row_max), _ptr(keep_value), _ptr(keep_id), _ptr(out), msg,
            ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return out

    def shard_cut_pick(self, hist, prefix, before, target):
        hist, target = _c(hist.long()), _c(target.double())
        prefix, before = prefix.long().clone().contiguous(), before.long().clone().contiguous()
        msg = ctypes.create_string_buffer(1024)
        rc = self.lib.xk_emu_shard_cut_pick(_ptr(hist), ctypes.c_int64(hist.shape[0]), ctypes.c_int64(hist.shape[1]),
                                            _ptr(target), _ptr(prefix), _ptr(before), msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return prefix, before

    def shard_cut_candidates(self, logits, scale, count, vocab_start, ignore_id=-1, row_max=None):
        r, v = logits.shape
        logits, scale = _c(logits), _c(scale.float())
        row_max = None if row_max is None else _c(row_max.float())
        keys = torch.empty(r, count, dtype=torch.int64)
        weights = torch.zeros(r, count if row_max is not None else 0, 2, dtype=torch.int64)
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_shard_cut_candidates(
            _ptr(logits), LOGITS_TYPES[logits.dtype], i64(r), i64(v), i64(vocab_start), i64(ignore_id), i64(count),
            _ptr(scale), _ptr(row_max), _ptr(keys), _ptr(weights) if row_max is not None else None, msg,
            ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return keys, weights

    def shard_cut_blocks_per_row(self, r, v):
        self.lib.xk_emu_shard_cut_blocks_per_row.restype = ctypes.c_int64
        return self.lib.xk_emu_shard_cut_blocks_per_row(ctypes.c_int64(r), ctypes.c_int64(v))

    def shard_row_stats(self, logits, vocab_start, rows=None, exclude=None, draft_probs=None, residual_stats=None,
                        ignore_id=-1, sample=False, raw_stats=False, temperature=0.0, seed=0, offset=0,
                        seed_tensor=None, offset_tensor=None, temperature_tensor=None, cut_value=None, cut_id=None):
        """seed_tensor / offset_tensor: 0-dim or one element (the scalar form) or [N] (per request)."""
        from xkernels.reference.sampling import is_per_row

        n, r, v = logits.shape
        rows, exclude, q, rs = _c(rows), _c(exclude), _c(draft_probs), _c(residual_stats)
        temps = None if temperature_tensor is None else _c(temperature_tensor.float())
        cut_value = None if cut_value is None else _c(cut_value.float())
        cut_id = None if cut_id is None else _c(cut_id.clamp(-(2**31), 2**31 - 1).to(torch.int32))
        per_request = is_per_row(seed_tensor, n) or is_per_row(offset_tensor, n)
        seed_tensor, offset_tensor = _c(seed_tensor), _c(offset_tensor)  # kept alive for the call
        numel = lambda t: 0 if t is None else t.numel()  # noqa: E731
        s = r if rows is None else rows.shape[1]
        logits = _c(logits)
        outs = [torch.empty(n, s, dtype=dt) for dt in (torch.float32, torch.float32, torch.int64, torch.float32,
                                                       torch.int64, torch.float32)]
        msg = ctypes.create_string_buffer(1024)
        i64 = ctypes.c_int64
        rc = self.lib.xk_emu_shard_row_stats(
            _ptr(logits), LOGITS_TYPES[logits.dtype], _ptr(rows), _ptr(exclude), _ptr(q), _ptr(rs), i64(n), i64(r),
            i64(v), i64(s), i64(0 if exclude is None else exclude.shape[2]), i64(0 if q is None else q.shape[1]),
            i64(vocab_start), i64(ignore_id), ctypes.c_int(sample), ctypes.c_int(raw_stats),
            ctypes.c_float(_inv_t(temperature)), _ptr(temps), ctypes.c_uint64(seed % 2**64),
            ctypes.c_uint64(offset % 2**64), _ptr(seed_tensor), i64(numel(seed_tensor)), _ptr(offset_tensor),
            i64(numel(offset_tensor)), ctypes.c_int(per_request), _ptr(cut_value), _ptr(cut_id),
            *[_ptr(t) for t in outs], msg, ctypes.c_size_t(len(msg)))
        self._check(rc, msg)
        return tuple(outs)
