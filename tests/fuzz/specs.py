"""What the fuzz campaign knows of each public op: how to make a valid call, which value
mutations it documents (and whether each must raise), and what a returned result must satisfy.

A spec's arguments are a flat dict of the Python entry point's arguments (the refine weights one
entry each); `call` turns it into the call. Tensors are made small, so a campaign of thousands of
calls runs in a couple of minutes.
"""

import inspect
import math
from types import SimpleNamespace

import torch

import xkernels
from xkernels import reference
from xkernels.reference.shard_cut import CUT_SHIFTS, cut_keep_all_key, cut_rank_keys, cut_weight_values

RAISE, EITHER, SAME = "raise", "either", "same"
LOGITS = (torch.float32, torch.bfloat16, torch.float16)
BIG_IDS = (2**40, -3, -2**63, 2**63 - 1)
# An int the op's checks must reject wherever it goes: it passes no range check of a real size.
TEMPERATURES_BAD = (-1.0, math.nan, math.inf, -math.inf)
TEMPERATURES_ODD = (1e-40, 1e-30, 1e30, 3.0)
# The sampling parameters a call may give as [N] tensors, as Spec.tensors lists them (an op takes
# those its signature has).
SAMPLING_TENSORS = {"temperature": "f32", "top_k": "ids32", "top_p": "f32", "min_p": "f32"}
FILTERS = ("top_k", "top_p", "min_p")


class Gen:
    """The random source of one case: Python's for choices, a torch generator for tensors."""

    def __init__(self, rng):
        self.r = rng
        self.g = torch.Generator().manual_seed(rng.getrandbits(62))

    def int(self, lo, hi):
        return self.r.randint(lo, hi)

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    def coin(self, p=0.5):
        return self.r.random() < p

    def logits(self, *shape, dtype=torch.float32):
        return (torch.randn(*shape, generator=self.g) * 3).to(dtype)

    def ids(self, *shape, hi):
        return torch.randint(0, max(hi, 1), shape, generator=self.g) if hi > 0 else torch.zeros(shape, dtype=torch.long)

    def probs(self, *shape):
        return torch.randn(*shape, generator=self.g).softmax(-1) if shape[-1] else torch.zeros(shape)

    def temperature(self):
        return self.pick((0.0, 0.0, 0.5, 1.0, 2.0))

    def rng_value(self):
        """A seed or offset: an int or a 0-dim int64 tensor (the batch-row form)."""
        value = self.pick((0, 1, 12345, 2**63 - 1, 2**64 - 1, -1))
        return torch.tensor(value - 2**64 if value >= 2**63 else value) if self.coin(0.3) else value


def _set(args, **changes):
    return {**args, **changes}


def _poke(t, value, where=None, g=None):
    """A copy of t with one entry (where, or a random one) set to value."""
    t = t.clone()
    if t.numel():
        flat = t.view(-1)
        flat[where if where is not None else int(torch.randint(0, t.numel(), (1,), generator=g))] = value
    return t


class Spec:
    name = ""
    schema = None  # the op's schema name where it is not the entry point's
    tensors = {}  # argument -> kind: ids, logits, f32, weight, i32, cache, rng
    primary = ""  # the argument whose device the others must share
    optional = ()  # tensor arguments that may be None
    huge_dims = {}  # argument -> dims whose size has a limit (a vocabulary, nodes): grown past it

    @property
    def fn(self):
        return getattr(xkernels, self.name)

    def call(self, args):
        return self.fn(**args)

    def rng_mutations(self, g, args):
        """Value mutations of the seed and offset arguments, where the op has them."""
        out = []
        for name in ("seed", "offset"):
            if name not in args:
                continue
            out += [
                (f"{name}=2**64", _set(args, **{name: 2**64}), RAISE, {name}),
                (f"{name}=-2**63-1", _set(args, **{name: -2**63 - 1}), RAISE, {name}),
                (f"{name}=2**64-1", _set(args, **{name: 2**64 - 1}), EITHER, set()),
                (f"{name} int32 tensor", _set(args, **{name: torch.tensor([3], dtype=torch.int32)}), RAISE, {name}),
                (f"{name} N + 2 elements", _set(args, **{name: torch.arange(self.batch(args) + 2)}), RAISE, {name}),
                (f"{name} float tensor", _set(args, **{name: torch.tensor([3.0])}), RAISE, {name}),
                (f"{name} float", _set(args, **{name: 3.5}), EITHER, {name}),
                (f"{name} string", _set(args, **{name: "7"}), EITHER, {name}),
                (f"{name} meta tensor", _set(args, **{name: torch.tensor([5], device="meta")}), RAISE,
                 {name, self.primary}),
                (f"{name} [1, 1] tensor", _set(args, **{name: torch.tensor([[5]])}), EITHER, {name}),
            ]
        if "temperature" in args:
            out += [(f"temperature={t}", _set(args, temperature=t), RAISE, {"temperature"}) for t in TEMPERATURES_BAD]
            out += [(f"temperature={t}", _set(args, temperature=t), EITHER, set()) for t in TEMPERATURES_ODD]
            out.append(("temperature string", _set(args, temperature="hot"), RAISE, {"temperature"}))
        return out

    def takes(self, name):
        return name in inspect.signature(self.fn).parameters

    def sampling_params(self, g, n):
        """sampling_params(g, n) without the arguments the op does not take."""
        return {k: v for k, v in sampling_params(g, n).items() if self.takes(k)}

    def sampling_mutations(self, args):
        """sampling_mutations of the arguments the op takes."""
        return [m for m in sampling_mutations(args, self.batch(args)) if all(self.takes(a) for a in m[3])]

    def batch(self, args):
        """N, the length a per-sequence tensor would have."""
        t = args.get(self.primary)
        return t.shape[0] if isinstance(t, torch.Tensor) and t.dim() else 0

    def value_mutations(self, g, args):
        return []

    def check(self, args, out):
        """Raises AssertionError if a returned result breaks the op's contract (args may be mutated)."""

    def reference(self, args):
        """The reference's result of a valid call, or None where the campaign does not compare."""
        return None

    def tolerance(self, args):
        """(rtol, atol) of float outputs against the reference."""
        return 1e-3, 1e-4


def _nonfinite_logits(g, args, name):
    t = args[name]
    if not t.numel():
        return []
    return [
        (f"{name} NaN", _set(args, **{name: _poke(t, math.nan, g=g.g)}), EITHER, set()),
        (f"{name} +inf", _set(args, **{name: _poke(t, math.inf, g=g.g)}), EITHER, set()),
        (f"{name} -inf row", _set(args, **{name: _poke_row(t, -math.inf)}), EITHER, set()),
        (f"{name} all NaN", _set(args, **{name: torch.full_like(t, math.nan)}), EITHER, set()),
        (f"{name} ties", _set(args, **{name: torch.zeros_like(t)}), EITHER, set()),
    ]


def _poke_row(t, value):
    t = t.clone()
    t.view(-1, t.shape[-1])[0] = value
    return t


def _rows_of_ids(t, v):
    return bool(((t >= 0) & (t < v)).all())


def _filters(args):
    """The filters a call gives, as a reference takes them."""
    return {k: args[k] for k in FILTERS if k in args}


# ---- chain_verify ----


class ChainVerify(Spec):
    name = "chain_verify"
    tensors = {"draft_tokens": "ids32", "target_logits": "logits", "draft_probs": "probs", "seed": "rng",
               "offset": "rng", **SAMPLING_TENSORS}
    primary = "target_logits"
    optional = ("draft_probs",) + FILTERS
    huge_dims = {"target_logits": (2,)}

    def valid(self, g):
        n, k, v = g.int(0, 3), g.int(0, 4), g.int(1, 40)
        args = dict(draft_tokens=g.ids(n, k, hi=v), target_logits=g.logits(n, k + 1, v, dtype=g.pick(LOGITS)),
                    temperature=g.temperature(), seed=g.rng_value(), offset=g.rng_value())
        if g.coin():
            args["draft_probs"] = g.probs(n, k, v)
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        return args

    def value_mutations(self, g, args):
        d, v = args["draft_tokens"], args["target_logits"].shape[-1]
        out = _nonfinite_logits(g, args, "target_logits") + self.sampling_mutations(args)
        for bad in (v, -1) + BIG_IDS:
            if d.numel():
                out.append((f"draft id {bad}", _set(args, draft_tokens=_poke(d, bad, g=g.g)), RAISE, {"draft_tokens"}))
        if args.get("draft_probs") is not None and d.numel():
            q = args["draft_probs"]
            out += [("draft_probs negative", _set(args, draft_probs=-q), EITHER, set()),
                    ("draft_probs NaN", _set(args, draft_probs=_poke(q, math.nan, g=g.g)), EITHER, set()),
                    ("draft_probs zero", _set(args, draft_probs=torch.zeros_like(q)), EITHER, set())]
        return out + self.rng_mutations(g, args)

    def check(self, args, out):
        d, logits, q = args["draft_tokens"], args["target_logits"], args.get("draft_probs")
        n, k = d.shape
        v = logits.shape[-1]
        assert logits.shape == (n, k + 1, v), \
            f"accepted target_logits {list(logits.shape)} for draft_tokens {list(d.shape)}"
        assert q is None or q.shape == (n, k, v), f"accepted draft_probs {list(q.shape)}"
        acc, toks = out[:2]
        assert len(out) == (3 if args.get("return_logprobs") else 2)
        assert acc.shape == (n,) and toks.shape == (n, k + 1) and acc.dtype == toks.dtype == torch.int64
        if args.get("return_logprobs"):
            lp = out[2]
            assert lp.shape == (n, k + 1) and lp.dtype == torch.float32
            for s in range(n):
                a = int(acc[s])
                assert bool(lp[s, a + 1:].isnan().all()), "logprobs not NaN padded"
                assert not bool((lp[s, : a + 1] > 1e-4).any()), "a log-probability above 0"
        for s in range(n):
            a = int(acc[s])
            assert 0 <= a <= k, f"accept_len {a} outside [0, {k}]"
            assert torch.equal(toks[s, :a], d[s, :a]), "out_tokens do not start with the accepted drafts"
            assert 0 <= int(toks[s, a]) < v, f"out_tokens[{s}, {a}] = {int(toks[s, a])} outside [0, {v})"
            assert bool((toks[s, a + 1:] == -1).all()), "out_tokens not -1 past the emitted tokens"

    def reference(self, args):
        extra = {k: args[k] for k in ("top_k", "top_p", "min_p", "method", "return_logprobs") if k in args}
        return reference.chain_verify(args["draft_tokens"], args["target_logits"], args.get("draft_probs"),
                                      temperature=args["temperature"], seed=args["seed"], offset=args["offset"],
                                      **extra)


def sampling_params(g, n):
    """The engine form of the sampling ops' arguments, each present at random: per-sequence
    temperatures (0 rows greedy), the filters as scalars or [N] tensors, per-request streams (seed,
    offset or both [N]), and chain_verify's method and logprobs (Spec.sampling_params keeps what an
    op takes)."""
    per_row = lambda values, dtype: torch.tensor([g.pick(values) for _ in range(n)], dtype=dtype)  # noqa: E731
    out = {"method": g.pick(("token", "block")), "return_logprobs": g.coin()}
    if g.coin():
        out["temperature"] = per_row((0.0, 0.7, 1.5), torch.float32)
    if g.coin():
        out["top_k"] = g.pick((0, 1, 3, per_row((0, 2, 5), torch.int64)))
    if g.coin():
        out["top_p"] = g.pick((1.0, 0.5, per_row((1.0, 0.3, 0.9), torch.float32)))
    if g.coin():
        out["min_p"] = g.pick((0.0, 0.2, per_row((0.0, 0.1), torch.float32)))
    if g.coin():  # per request: either [N] makes the call's streams per request
        form = g.pick(("both", "seed", "offset"))
        if form != "offset":
            out["seed"] = torch.tensor([g.int(-2**62, 2**62) for _ in range(n)], dtype=torch.long)
        if form != "seed":
            out["offset"] = torch.tensor([g.int(0, 100) for _ in range(n)], dtype=torch.long)
    return out


# sampling_mutations' per-row values that an op with an errors flag given (chain_verify_ragged_)
# reports there, read as off, instead of raising.
FLAGGED = {"temperature [N] negative", "temperature [N] NaN", "top_k [N] negative", "top_p [N] zero", "min_p [N] 1.5"}


def sampling_mutations(args, n):
    """Bad sampling parameters, scalar and per row (a per-row value is checked only where N > 0),
    each blaming the argument it changes."""
    some = RAISE if n else EITHER
    return [("top_k=-1", _set(args, top_k=-1), RAISE, {"top_k"}),
            ("top_p=0", _set(args, top_p=0.0), RAISE, {"top_p"}),
            ("top_p=1.5", _set(args, top_p=1.5), RAISE, {"top_p"}),
            ("top_p=nan", _set(args, top_p=math.nan), RAISE, {"top_p"}),
            ("top_p string", _set(args, top_p="0.5"), RAISE, {"top_p"}),
            ("min_p=-0.1", _set(args, min_p=-0.1), RAISE, {"min_p"}),
            ("min_p=1.5", _set(args, min_p=1.5), RAISE, {"min_p"}),
            ("method='tree'", _set(args, method="tree"), RAISE, {"method"}),
            ("temperature None", _set(args, temperature=None), RAISE, {"temperature"}),
            ("temperature [N+1]", _set(args, temperature=torch.ones(n + 1)), RAISE, {"temperature"}),
            ("temperature [N] float64", _set(args, temperature=torch.ones(n, dtype=torch.float64)), RAISE,
             {"temperature"}),
            ("temperature [N] negative", _set(args, temperature=-torch.ones(n)), some, {"temperature"}),
            ("temperature [N] NaN", _set(args, temperature=torch.full((n,), math.nan)), some, {"temperature"}),
            ("top_k [N] float", _set(args, top_k=torch.ones(n)), RAISE, {"top_k"}),
            ("top_k [N] negative", _set(args, top_k=torch.full((n,), -2)), some, {"top_k"}),
            ("top_p [N+1]", _set(args, top_p=torch.ones(n + 1)), RAISE, {"top_p"}),
            ("top_p [N] zero", _set(args, top_p=torch.zeros(n)), some, {"top_p"}),
            ("min_p [N] 1.5", _set(args, min_p=torch.full((n,), 1.5)), some, {"min_p"})]


class ChainVerifyRagged(Spec):
    name, schema = "chain_verify_ragged", "chain_verify_ragged_"
    tensors = {"draft_tokens": "ids32", "cu_num_draft_tokens": "ids32", "target_logits": "logits",
               "draft_probs": "probs", "seed": "rng", "offset": "rng", "out": "out_i32", "num_emitted": "out_i32",
               "logprobs": "out_f32", "errors": "out_i32", **SAMPLING_TENSORS}
    primary = "target_logits"
    optional = ("draft_probs", "out", "num_emitted", "logprobs", "errors") + FILTERS
    huge_dims = {"target_logits": (1,)}

    def batch(self, args):
        cu = args.get("cu_num_draft_tokens")  # a tensor, or a numpy array (the "as numpy" mutation)
        return cu.shape[0] if getattr(cu, "ndim", 0) else 0

    def valid(self, g):
        n, v = g.int(0, 3), g.int(1, 30)
        ks = [g.int(0, 3) for _ in range(n)]
        t = sum(ks)
        idt = g.pick((torch.int64, torch.int32))
        args = dict(draft_tokens=g.ids(t, hi=v).to(g.pick((torch.int64, torch.int32))),
                    cu_num_draft_tokens=torch.tensor(ks, dtype=torch.int64).cumsum(0).to(idt),
                    target_logits=g.logits(t + n, v, dtype=g.pick(LOGITS)),
                    max_spec_len=max(ks, default=0) + g.int(0, 1),
                    temperature=g.temperature(), seed=g.rng_value(), offset=g.rng_value())
        if g.coin():
            args["draft_probs"] = g.probs(t, v)
        args.update(self.sampling_params(g, n))
        if g.coin(0.3):
            width = args["max_spec_len"] + 1
            args.update(out=torch.zeros(n, width, dtype=torch.int32), num_emitted=torch.zeros(n, dtype=torch.int32),
                        logprobs=torch.zeros(n, width))
        if g.coin(0.3):
            args["errors"] = torch.zeros(n, dtype=torch.int32)
        return args

    def value_mutations(self, g, args):
        d, cu, v = args["draft_tokens"], args["cu_num_draft_tokens"], args["target_logits"].shape[-1]
        n = cu.shape[0]
        flagged = args.get("errors") is not None
        out = _nonfinite_logits(g, args, "target_logits") + [
            (what, a, EITHER, names) if flagged and what in FLAGGED else (what, a, kind, names)
            for what, a, kind, names in self.sampling_mutations(args)]
        for bad in (v, -1, 2**31 - 1):
            if d.numel():
                out.append((f"draft id {bad}", _set(args, draft_tokens=_poke(d, bad, g=g.g)), RAISE, {"draft_tokens"}))
        if n:
            out.append(("cu not ending at T", _set(args, cu_num_draft_tokens=_poke(cu, int(cu[-1]) + 1, n - 1)), RAISE,
                        {"cu_num_draft_tokens", "target_logits", "draft_tokens"}))
            out.append(("cu negative", _set(args, cu_num_draft_tokens=_poke(cu, -1, 0)), RAISE,
                        {"cu_num_draft_tokens"}))
        if n > 1 and int(cu[-1]) > 0:
            c = cu.clone()
            c[0] = int(cu[-1]) + 1
            out.append(("cu decreasing", _set(args, cu_num_draft_tokens=c), RAISE, {"cu_num_draft_tokens"}))
        ks = torch.diff(cu.long(), prepend=torch.zeros(1, dtype=torch.long)) if n else torch.zeros(0)
        if n and int(ks.max()) > 0:
            out.append(("max_spec_len below a K_n", _set(args, max_spec_len=int(ks.max()) - 1), RAISE,
                        {"max_spec_len", "out", "num_emitted", "logprobs"}))  # given buffers: now too wide
        out += [("max_spec_len=-1", _set(args, max_spec_len=-1), RAISE, {"max_spec_len"}),
                ("max_spec_len=2**40", _set(args, max_spec_len=2**40), RAISE, {"max_spec_len"})]
        width = args["max_spec_len"] + 1
        narrow = torch.zeros(n, max(width - 1, 0), dtype=torch.int32)
        out += [("out too narrow", _set(args, out=narrow), RAISE, {"out"}),
                ("out int64", _set(args, out=torch.zeros(n, width, dtype=torch.int64)), RAISE, {"out"}),
                ("num_emitted [N+1]", _set(args, num_emitted=torch.zeros(n + 1, dtype=torch.int32)), RAISE,
                 {"num_emitted"}),
                ("logprobs float64", _set(args, logprobs=torch.zeros(n, width, dtype=torch.float64)), RAISE,
                 {"logprobs"})]
        return out + self.rng_mutations(g, args)

    def check(self, args, out):
        d, cu, logits = args["draft_tokens"], args["cu_num_draft_tokens"], args["target_logits"]
        n, v, width = cu.shape[0], logits.shape[-1], args["max_spec_len"] + 1
        ks = torch.diff(cu.long(), prepend=torch.zeros(1, dtype=torch.long)).tolist() if n else []
        assert all(k >= 0 for k in ks) and sum(ks) == d.shape[0] and logits.shape[0] == d.shape[0] + n, \
            "accepted inconsistent draft_tokens, cu_num_draft_tokens, target_logits"
        assert max(ks, default=0) < width, "accepted max_spec_len below a request's drafts"
        toks, emitted, lp = out
        assert toks.shape == lp.shape == (n, width) and emitted.shape == (n,)
        assert toks.dtype == emitted.dtype == torch.int32 and lp.dtype == torch.float32
        start = 0
        for s in range(n):
            e = int(emitted[s])
            assert 1 <= e <= ks[s] + 1, f"num_emitted {e} outside [1, {ks[s] + 1}]"
            assert torch.equal(toks[s, : e - 1].long(), d[start:start + e - 1].long()), "not the accepted drafts"
            assert 0 <= int(toks[s, e - 1]) < v, "the emitted token is outside [0, V)"
            assert bool((toks[s, e:] == -1).all()) and bool(lp[s, e:].isnan().all()), "not padded"
            start += ks[s]

    def reference(self, args):
        keys = ("draft_probs", "temperature", "top_k", "top_p", "min_p", "seed", "offset", "method")
        from xkernels.reference.chain import chain_verify_ragged

        return chain_verify_ragged(args["draft_tokens"], args["cu_num_draft_tokens"], args["target_logits"],
                                             args["max_spec_len"], **{k: args[k] for k in keys if k in args})


def _as_accept_len(args):
    """args with a mutated num_emitted buffer passed as accept_len (the in-place form's name for it),
    which call() would otherwise drop in favour of the valid accept_len."""
    if "num_emitted" not in args:
        return args
    args = dict(args)
    args["accept_len"] = args.pop("num_emitted")
    return args


class ChainVerifyRaggedInPlace(ChainVerifyRagged):
    """chain_verify_ragged_: the same cases, its buffers from the allocating form's arguments (out and
    num_emitted given or zeros of max_spec_len + 1, the latter as accept_len; logprobs as given)."""
    name, schema = "chain_verify_ragged_", "chain_verify_ragged_"
    tensors = {("accept_len" if k == "num_emitted" else k): v for k, v in ChainVerifyRagged.tensors.items()}
    optional = tuple("accept_len" if k == "num_emitted" else k for k in ChainVerifyRagged.optional)

    def valid(self, g):
        args = super().valid(g)
        if "num_emitted" in args:
            args["accept_len"] = args.pop("num_emitted")
        return args

    def call(self, args):
        args = dict(args)
        n, width = self.batch(args), args.pop("max_spec_len") + 1
        out, accept_len = args.pop("out", None), args.pop("accept_len", args.pop("num_emitted", None))
        device = getattr(args.get("target_logits"), "device", None)  # the buffers made here go where the logits are
        return self.fn(args.pop("draft_tokens"), args.pop("cu_num_draft_tokens"), args.pop("target_logits"),
                       torch.zeros(n, width, dtype=torch.int32, device=device) if out is None else out,
                       torch.zeros(n, dtype=torch.int32, device=device) if accept_len is None else accept_len, **args)

    def value_mutations(self, g, args):
        # max_spec_len is the width of out here: its own bad values would be buffers of that width, and
        # with out given it is not read at all
        dropped = ("max_spec_len", "out too") if args.get("out") is not None else ("max_spec_len=", "out too")
        kept = [m for m in super().value_mutations(g, args) if not m[0].startswith(dropped)]
        return [(what, _as_accept_len(a), kind, set(names) | {"accept_len", "out"}) for what, a, kind, names in kept]

    def check(self, args, out):
        accept_len, toks, *lp = out
        assert accept_len.dtype == torch.int32 and accept_len.shape == toks.shape[:1]
        logprobs = lp[0] if lp else torch.full(toks.shape, float("nan"))
        super().check(args, (toks, accept_len + 1, logprobs))

    def reference(self, args):
        toks, emitted, logprobs = super().reference(args)
        return (emitted - 1, toks, logprobs) if args.get("logprobs") is not None else (emitted - 1, toks)


# ---- the refine ops ----


class _Refine(Spec):
    primary = "ctx"
    optional = FILTERS
    huge_dims = {"base_logits": (2,)}
    token_arg = ""
    prefix = True

    @property
    def tensors(self):
        return {"ctx": "f32", self.token_arg: "ids32", "base_logits": "logits", "emb": "weight", "mix": "weight",
                "w_gate": "weight", "w_up": "weight", "w_down": "weight", "w_read": "weight", "seed": "rng",
                "offset": "rng", **SAMPLING_TENSORS}

    def valid(self, g):
        n, b = g.int(0, 2), g.int(1, 4)
        d, r, h, v = g.int(1, b), g.int(1, 6), g.int(1, 6), g.int(1, 30)
        wdt = g.pick((torch.float32, torch.bfloat16))
        w = lambda *s: (torch.randn(*s, generator=g.g) * 0.5).to(wdt)  # noqa: E731
        length = b - d + 1 if self.prefix else b
        args = {"ctx": torch.randn(n, b, r, generator=g.g), self.token_arg: g.ids(n, length, hi=v),
                "base_logits": g.logits(n, d, v, dtype=g.pick(LOGITS)), "emb": w(v, r), "mix": w(r, b, b),
                "w_gate": w(h, r), "w_up": w(h, r), "w_down": w(r, h), "w_read": w(v, r),
                "temperature": g.temperature(), "seed": g.rng_value(), "offset": g.rng_value()}
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        return args

    def call(self, args):
        args = dict(args)
        weights = xkernels.RefinerWeights(*(args.pop(k) for k in xkernels.RefinerWeights._fields))
        return self.fn(args.pop("ctx"), args.pop(self.token_arg), args.pop("base_logits"), weights, **args)

    def value_mutations(self, g, args):
        t, v = args[self.token_arg], args["w_read"].shape[0]
        out = _nonfinite_logits(g, args, "base_logits") + _nonfinite_logits(g, args, "ctx")
        for bad in (v, -1) + BIG_IDS:
            if t.numel():
                out.append((f"token id {bad}", _set(args, **{self.token_arg: _poke(t, bad, g=g.g)}), RAISE,
                            {self.token_arg}))
        return out + self.sampling_mutations(args) + self.rng_mutations(g, args)

    def check(self, args, out):
        ctx, base = args["ctx"], args["base_logits"]
        n, b, r = ctx.shape
        d, v = base.shape[1], base.shape[2]
        assert base.shape[0] == n and 1 <= d <= b, f"accepted base_logits {list(base.shape)} for ctx {list(ctx.shape)}"
        want = b - d + 1 if self.prefix else b
        assert args[self.token_arg].shape == (n, want), f"accepted {self.token_arg} {list(args[self.token_arg].shape)}"
        tokens, logprobs = out[0], out[1]
        assert tokens.shape == (n, d) and tokens.dtype == torch.int64 and logprobs.dtype == torch.float32
        assert _rows_of_ids(tokens, v), f"tokens outside [0, {v})"
        assert not bool((logprobs > 1e-4).any()), "a log-probability above 0"
        if len(out) == 3:
            iters = out[2]
            assert iters.shape == (n,) and iters.dtype == torch.int32
            assert n == 0 or 0 <= int(iters.min()) <= int(iters.max()) <= args["max_iters"], \
                "iters outside [0, max_iters]"

    def reference(self, args):
        a = dict(args)
        weights = xkernels.RefinerWeights(*(a.pop(k) for k in xkernels.RefinerWeights._fields))
        return getattr(reference, self.name)(a.pop("ctx"), a.pop(self.token_arg), a.pop("base_logits"), weights, **a)

    def tolerance(self, args):
        # bfloat16 weights: the CPU's read multiplies bfloat16 z (oneDNN), the reference float32 z
        return (1e-2, 1e-2) if args["w_read"].dtype == torch.bfloat16 else super().tolerance(args)


class RefineStep(_Refine):
    name, token_arg, prefix = "refine_step", "prev_tokens", False


class JacobiRefine(_Refine):
    name, token_arg = "jacobi_refine", "prefix_tokens"

    def valid(self, g):
        return {**super().valid(g), "max_iters": g.int(0, 5)}

    def value_mutations(self, g, args):
        return super().value_mutations(g, args) + [
            ("max_iters=-1", _set(args, max_iters=-1), RAISE, {"max_iters"}),
            ("max_iters=2**40", _set(args, max_iters=2**40), EITHER, {"max_iters"}),
            ("max_iters=2**63", _set(args, max_iters=2**63), RAISE, {"max_iters"}),
        ]


class SequentialRefine(_Refine):
    name, token_arg = "sequential_refine", "prefix_tokens"


# ---- draft trees ----


def random_tree(g, n, m):
    """parents [N, M] of valid trees (topological order) and, half the time, num_nodes [N]."""
    parents = torch.full((n, m), -1, dtype=torch.long)
    for s in range(n):
        for i in range(1, m):
            parents[s, i] = g.int(0, i - 1)
    num_nodes = torch.tensor([g.int(1, m) for _ in range(n)], dtype=torch.long) if g.coin() else None
    return parents, num_nodes


def tree_mutations(g, args, name="parents"):
    par, nn = args[name], args.get("num_nodes")
    n, m = par.shape
    out = []
    if n and m > 1:
        i = g.int(1, m - 1)
        s = g.int(0, n - 1)
        real = nn is None or i < int(nn[s])
        for bad, label in ((i, "self"), (i + 1, "forward"), (-1, "-1"), (2**40, "2**40"), (-3, "-3")):
            p = par.clone()
            p[s, i] = bad
            out.append((f"{name}[{i}] {label}", _set(args, **{name: p}), RAISE if real else EITHER,
                        {name} if real else set()))
    if n:
        p = par.clone()
        p[0, 0] = 0
        out.append((f"{name} root 0", _set(args, **{name: p}), RAISE, {name}))
        for bad in (0, m + 1, -1, 2**40):
            nodes = (nn if nn is not None else torch.full((n,), m, dtype=torch.long)).clone()
            nodes[g.int(0, n - 1)] = bad
            out.append((f"num_nodes {bad}", _set(args, num_nodes=nodes), RAISE, {"num_nodes"}))
    return out


def check_tree_shape(par, nn):
    n, m = par.shape
    assert par.dim() == 2 and m >= 1, f"accepted parents {list(par.shape)}"
    assert nn is None or nn.shape == (n,), f"accepted num_nodes {list(nn.shape)}"
    counts = [m] * n if nn is None else [int(x) for x in nn]
    for s in range(n):
        assert 1 <= counts[s] <= m, f"accepted num_nodes {counts[s]} outside [1, {m}]"
        assert int(par[s, 0]) == -1, "accepted a root whose parent is not -1"
        for i in range(1, counts[s]):
            assert 0 <= int(par[s, i]) < i, f"accepted parents[{s}, {i}] = {int(par[s, i])}"
    return counts


class BuildDraftTree(Spec):
    name = "build_draft_tree"
    tensors = {"topk_logprobs": "f32", "topk_tokens": "ids32"}
    primary = "topk_logprobs"
    huge_dims = {"topk_logprobs": (1, 2), "topk_tokens": (1, 2)}

    def valid(self, g):
        n, d, k = g.int(0, 3), g.int(0, 4), g.int(0, 4)
        lp = torch.sort(g.probs(n, d, max(k, 1)).log()[..., :k], dim=-1, descending=True).values
        return dict(topk_logprobs=lp, topk_tokens=g.ids(n, d, k, hi=50), budget=g.int(0, 12),
                    mask=g.pick((None, "bool", "packed")))

    def value_mutations(self, g, args):
        tok, lp = args["topk_tokens"], args["topk_logprobs"]
        out = [(f"mask={bad!r}", _set(args, mask=bad), RAISE, {"mask"}) for bad in ("dense", True)]
        if tok.numel():
            for bad in (-5, -1, 2**40, 2**31 - 1, 2**31):
                out.append((f"topk_tokens {bad}", _set(args, topk_tokens=_poke(tok, bad, g=g.g)), RAISE,
                            {"topk_tokens"}))
            out += [("topk_logprobs NaN", _set(args, topk_logprobs=_poke(lp, math.nan, g=g.g)), EITHER, set()),
                    ("topk_logprobs -inf", _set(args, topk_logprobs=_poke(lp, -math.inf, g=g.g)), EITHER, set()),
                    ("topk_logprobs unsorted", _set(args, topk_logprobs=lp.flip(-1)), EITHER, set()),
                    ("topk_logprobs positive", _set(args, topk_logprobs=-lp), EITHER, set())]
        out += [(f"budget={bad}", _set(args, budget=bad), RAISE, {"budget"}) for bad in (-1, 2**31 - 1, 2**40, -2**63)]
        # 2**31 - 2 passes the range check; for 2**21 sequences (stride-0 inputs) no machine holds
        # the outputs (2^55 bytes), which must raise naming budget (a few sequences would really be
        # allocated).
        small = (1, min(lp.shape[1], 1), min(lp.shape[2], 1))  # the token check reads 2**21 of these at most
        many = lambda t: torch.zeros(small, dtype=t.dtype).expand((2**21,) + small[1:])  # noqa: E731
        out.append(("budget=2**31-2, 2**21 sequences", _set(args, budget=2**31 - 2, topk_logprobs=many(lp),
                                                             topk_tokens=many(tok)), RAISE, {"budget"}))
        return out

    def check(self, args, out):
        lp, tok, budget = args["topk_logprobs"], args["topk_tokens"], args["budget"]
        assert lp.shape == tok.shape, f"accepted topk_tokens {list(tok.shape)} for topk_logprobs {list(lp.shape)}"
        n, m = lp.shape[0], budget + 1
        tokens, parents, num_nodes, depth = out[:4]
        assert tokens.shape == parents.shape == depth.shape == (n, m) and num_nodes.shape == (n,)
        counts = check_tree_shape(parents, num_nodes)
        if args["mask"] is None:
            assert len(out) == 4
        else:  # the same launch's mask: the tree's own
            want = reference.tree_attention_mask(parents, num_nodes, packed=args["mask"] == "packed")
            assert torch.equal(out[4], want), "the mask is not the tree's"
        for s in range(n):
            c = counts[s]
            assert int(tokens[s, 0]) == -1 and int(depth[s, 0]) == 0
            cand = set(tok[s].flatten().tolist())
            for i in range(1, c):
                assert int(tokens[s, i]) in cand, f"node {i}'s token {int(tokens[s, i])} is no candidate"
                assert int(depth[s, i]) == int(depth[s, int(parents[s, i])]) + 1
            assert bool((tokens[s, c:] == -1).all() and (parents[s, c:] == -1).all() and (depth[s, c:] == 0).all()), \
                "padding nodes not (-1, -1, 0)"

    def reference(self, args):
        out = reference.build_draft_tree(args["topk_logprobs"], args["topk_tokens"], args["budget"])
        if args["mask"] is None:
            return out
        return (*out, reference.tree_attention_mask(out[1], out[2], packed=args["mask"] == "packed"))


class TreeAttentionMask(Spec):
    name = "tree_attention_mask"
    tensors = {"parents": "ids32", "num_nodes": "ids"}
    primary = "parents"
    optional = ("num_nodes",)

    def valid(self, g):
        parents, num_nodes = random_tree(g, g.int(0, 3), g.int(1, 11))
        return dict(parents=parents, num_nodes=num_nodes, layout=g.pick(("bool", "packed")))

    def value_mutations(self, g, args):
        return tree_mutations(g, args) + [("layout='dense'", _set(args, layout="dense"), RAISE, {"layout"}),
                                          ("layout=None", _set(args, layout=None), RAISE, {"layout"})]

    def check(self, args, out):
        par = args["parents"]
        check_tree_shape(par, args.get("num_nodes"))
        n, m = par.shape
        if args["layout"] == "packed":
            assert out.shape == (n, m, (m + 7) // 8) and out.dtype == torch.uint8
        else:
            assert out.shape == (n, m, m) and out.dtype == torch.bool

    def reference(self, args):
        return reference.tree_attention_mask(args["parents"], args.get("num_nodes"), args["layout"] == "packed")


class TreePositions(Spec):
    name = "tree_positions"
    tensors = {"parents": "ids32", "num_nodes": "ids"}
    primary = "parents"
    optional = ("num_nodes",)

    def valid(self, g):
        parents, num_nodes = random_tree(g, g.int(0, 3), g.int(1, 11))
        return dict(parents=parents, num_nodes=num_nodes)

    def value_mutations(self, g, args):
        return tree_mutations(g, args)

    def check(self, args, out):
        check_tree_shape(args["parents"], args.get("num_nodes"))
        assert out.shape == args["parents"].shape and out.dtype == torch.int64

    def reference(self, args):
        return reference.tree_positions(args["parents"], args.get("num_nodes"))


def repeated_siblings(args):
    """Whether two children of a node hold one token: no draw without replacement gives that; the
    residual walk then reaches one that is 0 exactly, which the kernels' closed form leaves at
    rounding (seed 2 case 216: a child accepted where the reference emits the argmax)."""
    tok, par = args["tokens"], args["parents"]
    nn = args.get("num_nodes")
    for s in range(tok.shape[0]):
        count = tok.shape[1] if nn is None else int(nn[s])
        pairs = [(int(par[s, i]), int(tok[s, i])) for i in range(1, count)]
        if len(set(pairs)) < len(pairs):
            return True
    return False


class TreeVerify(Spec):
    name = "tree_verify"
    tensors = {"tokens": "ids32", "parents": "ids32", "target_logits": "logits", "draft_probs": "probs",
               "num_nodes": "ids", "seed": "rng", "offset": "rng", **SAMPLING_TENSORS}
    primary = "target_logits"
    optional = ("draft_probs", "num_nodes") + FILTERS
    huge_dims = {"target_logits": (2,), "parents": (1,)}

    def valid(self, g):
        n, m, v = g.int(0, 3), g.int(1, 8), g.int(1, 30)
        parents, num_nodes = random_tree(g, n, m)
        tokens = g.ids(n, m, hi=v)
        tokens[:, 0] = -1
        args = dict(tokens=tokens, parents=parents, target_logits=g.logits(n, m, v, dtype=g.pick(LOGITS)),
                    num_nodes=num_nodes, without_replacement=g.coin(), temperature=g.temperature(),
                    seed=g.rng_value(), offset=g.rng_value())
        if g.coin():
            args["draft_probs"] = g.probs(n, m, v)
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        return args

    def value_mutations(self, g, args):
        tok, nn, v = args["tokens"], args.get("num_nodes"), args["target_logits"].shape[-1]
        n, m = tok.shape
        out = tree_mutations(g, args) + _nonfinite_logits(g, args, "target_logits")
        if n and m > 1:
            s, i = g.int(0, n - 1), g.int(1, m - 1)
            real = nn is None or i < int(nn[s])
            for bad in (v, -1) + BIG_IDS:
                t = tok.clone()
                t[s, i] = bad
                out.append((f"tokens[{i}] {bad}", _set(args, tokens=t), RAISE if real else EITHER,
                            {"tokens"} if real else set()))
        if n:
            t = tok.clone()
            t[:, 0] = 2**40
            out.append(("root token 2**40", _set(args, tokens=t), EITHER, set()))
        if args.get("draft_probs") is not None:
            q = args["draft_probs"]
            out += [("draft_probs negative", _set(args, draft_probs=-q), EITHER, set()),
                    ("draft_probs zero", _set(args, draft_probs=torch.zeros_like(q)), EITHER, set())]
        return out + self.sampling_mutations(args) + self.rng_mutations(g, args)

    def check(self, args, out):
        tok, par, logits = args["tokens"], args["parents"], args["target_logits"]
        counts = check_tree_shape(par, args.get("num_nodes"))
        n, m = par.shape
        v = logits.shape[-1]
        assert tok.shape == (n, m) and logits.shape[:2] == (n, m), "accepted mismatched tokens or target_logits"
        for s in range(n):
            for i in range(1, counts[s]):
                assert 0 <= int(tok[s, i]) < v, f"accepted token {int(tok[s, i])} at a real node"
        acc, path, toks = out
        assert acc.shape == (n,) and path.shape == toks.shape == (n, m)
        for s in range(n):
            a = int(acc[s])
            assert 0 <= a < counts[s], f"accept_len {a} outside [0, {counts[s]})"
            assert int(path[s, 0]) == 0, "path does not start at the root"
            for j in range(1, a + 1):
                node = int(path[s, j])
                assert 0 < node < counts[s] and int(par[s, node]) == int(path[s, j - 1]), "path is not a walk down"
                assert int(toks[s, j - 1]) == int(tok[s, node]), "out_tokens are not the path's tokens"
            assert 0 <= int(toks[s, a]) < v, f"emitted token {int(toks[s, a])} outside [0, {v})"
            assert bool((path[s, a + 1:] == -1).all() and (toks[s, a + 1:] == -1).all()), "not -1 padded"

    def reference(self, args):
        if args["without_replacement"] and args.get("draft_probs") is not None and repeated_siblings(args):
            return None
        return reference.tree_verify(args["tokens"], args["parents"], args["target_logits"], args.get("draft_probs"),
                                     args["without_replacement"], args["temperature"], args["seed"], args["offset"],
                                     args.get("num_nodes"), **_filters(args))


class CompactKv(Spec):
    name = "compact_kv_"
    tensors = {"cache": "cache", "path": "ids", "accept_len": "ids"}
    primary = "cache"

    def valid(self, g):
        n, h, length, d = g.int(0, 3), g.int(1, 3), g.int(1, 10), g.int(1, 5)
        prefix = g.int(0, length - 1)
        m = g.int(1, length - prefix)
        path = torch.full((n, m), -1, dtype=torch.long)
        acc = torch.zeros(n, dtype=torch.long)
        for s in range(n):
            a = g.int(0, m - 1)
            nodes = sorted(g.r.sample(range(1, length - prefix), a)) if a else []
            path[s, : a + 1] = torch.tensor([0] + nodes)
            acc[s] = a
        cache = torch.randn(n, h, length, d, generator=g.g).to(g.pick((torch.float32, torch.bfloat16, torch.float64)))
        return dict(cache=cache, path=path, accept_len=acc, prefix_len=prefix)

    def value_mutations(self, g, args):
        cache, path, acc, pre = args["cache"], args["path"], args["accept_len"], args["prefix_len"]
        n, m = path.shape
        length = cache.shape[2]
        out = [(f"prefix_len={bad}", _set(args, prefix_len=bad), RAISE, {"prefix_len"})
               for bad in (-1, length, 2**40, -2**63)]
        if n:
            s = g.int(0, n - 1)
            for bad in (-1, m, 2**40):
                out.append((f"accept_len {bad}", _set(args, accept_len=_poke(acc, bad, s)), RAISE, {"accept_len"}))
            a = int(acc[s])
            for bad in (-1, length - pre, 2**40, -2**63):
                j = g.int(0, a)
                p = path.clone()
                p[s, j] = bad
                out.append((f"path[{j}] {bad}", _set(args, path=p), RAISE, {"path"}))
            if a >= 2:
                p = path.clone()
                p[s, 1], p[s, 2] = p[s, 2].clone(), p[s, 1].clone()
                out.append(("path decreasing", _set(args, path=p), RAISE, {"path"}))
        if cache.dim() == 4 and cache.shape[2] > 1 and cache.numel():
            out.append(("cache expanded over L", _set(args, cache=cache[:, :, :1].expand(cache.shape)), RAISE,
                        {"cache"}))
        if cache.dim() == 4 and n > 1 and cache.numel():
            out.append(("cache expanded over N", _set(args, cache=cache[:1].expand(cache.shape)), RAISE, {"cache"}))
        return out

    def check(self, args, out):
        cache, path, acc = args["cache"], args["path"], args["accept_len"]
        assert path.shape[0] == cache.shape[0] and acc.shape == (cache.shape[0],), "accepted mismatched shapes"

    def reference(self, args):
        return reference.compact_kv(args["cache"], args["path"], args["accept_len"], args["prefix_len"])


# ---- diffusion LLMs ----


def confidence_ties(logits, block, mask_id, tol=1e-6):
    """Whether two masked positions of a sequence have confidences within rounding (float64): their
    order, which the ops' float32 sums decide, may differ from the reference's."""
    raw = logits.double().clone()
    raw[..., mask_id] = -math.inf
    conf = raw.softmax(-1).max(-1).values
    for s in range(block.shape[0]):
        c = torch.sort(conf[s][block[s] == mask_id].nan_to_num(-1.0)).values
        if len(c) > 1 and bool((c[1:] - c[:-1] <= tol).any()):
            return True
    return False


def score_ties(scores, tol=1e-5):
    for row in scores:
        c = torch.sort(row[row != 0].double()).values
        if len(c) > 1 and bool((c[1:] - c[:-1] <= tol).any()):
            return True
    return False


def random_block(g, n, length, v, mask_id):
    block = g.ids(n, length, hi=v)
    masked = torch.rand(n, length, generator=g.g) < 0.6
    return torch.where(masked, mask_id, block)


def block_mutations(g, args, block_name, mask_name="mask_id", v=None):
    block, mask_id = args[block_name], args[mask_name]
    # A mask id outside the vocabulary is allowed (a head without the mask token).
    out = [(f"mask_id={bad}", _set(args, **{mask_name: bad}), EITHER, set()) for bad in (v, -1, 2**40, -2**63)]
    unmasked = (block != mask_id).nonzero()
    if len(unmasked):
        where = tuple(unmasked[g.int(0, len(unmasked) - 1)].tolist())
        for bad in (v, -3, -1, 2**40):
            b = block.clone()
            b[where] = bad
            out.append((f"{block_name} id {bad}", _set(args, **{block_name: b}), RAISE, {block_name}))
    return out


def unmask_mutations(args):
    return [("num_unmask=0", _set(args, num_unmask=0), RAISE, {"num_unmask"}),
            ("num_unmask=-1", _set(args, num_unmask=-1), RAISE, {"num_unmask"}),
            ("num_unmask=2**40", _set(args, num_unmask=2**40), EITHER, set()),
            ("threshold=nan", _set(args, threshold=math.nan), RAISE, {"threshold"}),
            ("threshold=inf", _set(args, threshold=math.inf), RAISE, {"threshold"}),
            ("threshold=-5", _set(args, threshold=-5.0), EITHER, set()),
            ("threshold=2", _set(args, threshold=2.0), EITHER, set())]


class DllmStep(Spec):
    name = "dllm_step"
    tensors = {"logits": "logits", "block_tokens": "ids32", "seed": "rng", "offset": "rng", **SAMPLING_TENSORS}
    primary = "logits"
    optional = FILTERS
    huge_dims = {"logits": (1, 2)}

    def valid(self, g):
        n, length, v = g.int(0, 3), g.int(0, 6), g.int(1, 30)
        mask_id = g.int(0, v - 1)
        args = dict(logits=g.logits(n, length, v, dtype=g.pick(LOGITS)),
                    block_tokens=random_block(g, n, length, v, mask_id),
                    mask_id=mask_id, num_unmask=g.int(1, length + 1), threshold=g.pick((None, None, 0.1, 0.9)),
                    temperature=g.temperature(), seed=g.rng_value(), offset=g.rng_value())
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        return args

    def value_mutations(self, g, args):
        v = args["logits"].shape[-1]
        return (block_mutations(g, args, "block_tokens", v=v) + unmask_mutations(args) +
                _nonfinite_logits(g, args, "logits") + self.sampling_mutations(args) + self.rng_mutations(g, args))

    def check(self, args, out):
        logits, block, mask_id = args["logits"], args["block_tokens"], args["mask_id"]
        n, length, v = logits.shape
        assert block.shape == (n, length), f"accepted block_tokens {list(block.shape)} for logits {list(logits.shape)}"
        assert _rows_of_ids(block[block != mask_id], v), "accepted block_tokens outside [0, V)"
        new_block, positions, tokens, conf = out
        assert new_block.shape == positions.shape == tokens.shape == conf.shape == (n, length)
        assert conf.dtype == torch.float32
        for s in range(n):
            masked = (block[s] == mask_id)
            chosen = positions[s][positions[s] >= 0]
            c = len(chosen)
            assert bool((positions[s, c:] == -1).all() and (tokens[s, c:] == -1).all()), "not -1 padded"
            assert bool((chosen[1:] > chosen[:-1]).all()), "positions not ascending"
            assert bool(masked[chosen].all()), "unmasked a position that was not masked"
            want = int(masked.sum()) if args["threshold"] is None else None
            if want is not None:
                want = min(want, args["num_unmask"])
                assert c == want, f"unmasked {c} positions, want {want}"
            elif int(masked.sum()):
                assert c >= 1, "threshold unmasked nothing"
            assert _rows_of_ids(tokens[s, :c], v), "tokens outside [0, V)"
            expect = block[s].to(torch.int64, copy=True)  # an int32 block comes back int64; never the input itself
            expect[chosen] = tokens[s, :c]
            assert torch.equal(new_block[s], expect), "new_block is not the block with the chosen tokens"
            assert bool(torch.isneginf(conf[s][~masked]).all()), "confidence of an unmasked position is not -inf"
            cm = conf[s][masked]
            assert bool((cm.isnan() | ((cm >= 0) & (cm <= 1))).all()), "a confidence outside [0, 1]"

    def reference(self, args):
        if confidence_ties(args["logits"], args["block_tokens"], args["mask_id"]):
            return None
        return reference.dllm_step(args["logits"], args["block_tokens"], args["mask_id"], args["num_unmask"],
                                   args["threshold"], args["temperature"], args["seed"], args["offset"],
                                   **_filters(args))


# ---- Spiffy ----


def random_graph(g, length, v):
    """A DraftGraph of a few nodes, each its parent's operations and one more."""
    from xkernels.spiffy import DraftGraph

    nodes, edges = [frozenset()], []
    max_j = min(v, reference.SPIFFY_MAX_RANK)
    for _ in range(g.int(0, 6)):
        parent = g.int(0, len(nodes) - 1)
        free = [i for i in range(length) if all(i != a for a, _ in nodes[parent])]
        if not free:
            continue
        node = nodes[parent] | {(g.pick(free), g.int(0, max_j - 1))}
        if node in nodes:
            edges.append((parent, nodes.index(node)))
            continue
        nodes.append(node)
        edges.append((parent, len(nodes) - 1))
    return DraftGraph(nodes, sorted(set(edges)))


def graph_ns(ranks, child_ptr, children):
    return SimpleNamespace(ranks=ranks, child_ptr=child_ptr, children=children)


class SpiffyMaterialize(Spec):
    name = "spiffy_materialize"
    tensors = {"logits": "logits", "block_tokens": "ids32", "graph_ranks": "i32", "graph_child_ptr": "i32",
               "graph_children": "i32", **SAMPLING_TENSORS}
    primary = "logits"
    optional = FILTERS
    huge_dims = {"logits": (2,)}

    def valid(self, g):
        n, length, v = g.int(0, 3), g.int(1, 6), g.int(1, 30)
        mask_id = g.int(0, v - 1)
        graph = random_graph(g, length, v)
        args = dict(logits=g.logits(n, length, v, dtype=g.pick(LOGITS)),
                    block_tokens=random_block(g, n, length, v, mask_id), mask_id=mask_id,
                    graph_ranks=graph.ranks, graph_child_ptr=graph.child_ptr, graph_children=graph.children,
                    keep=g.int(0, len(graph) - 1), temperature=g.temperature())
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        return args

    def call(self, args):
        args = dict(args)
        graph = graph_ns(args.pop("graph_ranks"), args.pop("graph_child_ptr"), args.pop("graph_children"))
        return self.fn(args.pop("logits"), args.pop("block_tokens"), args.pop("mask_id"), graph, **args)

    def value_mutations(self, g, args):
        v = args["logits"].shape[-1]
        ranks, ptr, ch = args["graph_ranks"], args["graph_child_ptr"], args["graph_children"]
        length = args["block_tokens"].shape[1]
        out = block_mutations(g, args, "block_tokens", v=v)
        out += [(f"keep={bad}", _set(args, keep=bad), RAISE, {"keep"}) for bad in (-1, ranks.shape[0], 2**40)]
        graph = {"graph", "graph_ranks", "graph_child_ptr", "graph_children"}
        if ranks.shape[0] > 1:
            max_j = min(v, reference.SPIFFY_MAX_RANK)
            for bad_i, bad_j, label in ((length, 0, "position rank L"), (0, max_j, "rank V"),
                                        (-2, 0, "position rank -2"), (2**30, 0, "position rank 2**30")):
                r = ranks.clone()
                r[1, 0, 0], r[1, 0, 1] = bad_i, bad_j
                out.append((f"graph {label}", _set(args, graph_ranks=r), RAISE, graph))
            r = ranks.clone()
            r[0, 0] = torch.tensor([0, 0], dtype=torch.int32)
            out.append(("graph root with an operation", _set(args, graph_ranks=r), RAISE, graph))
        if ch.numel():
            for bad in (0, ranks.shape[0], -1, 2**30):
                out.append((f"graph child {bad}", _set(args, graph_children=_poke(ch, bad, 0)), RAISE, graph))
        out.append(("graph child_ptr end", _set(args, graph_child_ptr=_poke(ptr, int(ptr[-1]) + 1, ptr.numel() - 1)),
                    RAISE, graph))
        out.append(("graph child_ptr start", _set(args, graph_child_ptr=_poke(ptr, -1, 0)), RAISE, graph))
        return out + _nonfinite_logits(g, args, "logits") + self.sampling_mutations(args) + self.rng_mutations(g, args)

    def check(self, args, out):
        logits, block, keep = args["logits"], args["block_tokens"], args["keep"]
        n, length, v = logits.shape
        assert block.shape == (n, length), "accepted mismatched block_tokens"
        assert _rows_of_ids(block[block != args["mask_id"]], v), "accepted block ids outside [0, V)"
        drafts, node_ids, scores = out
        g = args["graph_ranks"].shape[0]
        assert drafts.shape == (n, keep, length) and node_ids.shape == (n, keep) and scores.shape == (n, keep)
        assert bool(((node_ids >= -1) & (node_ids < g)).all()), "node_ids outside [-1, G)"
        for s in range(n):
            for j in range(keep):
                if int(node_ids[s, j]) < 0:
                    assert torch.equal(drafts[s, j], block[s]) and float(scores[s, j]) == 0, \
                        "an unused slot is not the block"
                else:
                    changed = drafts[s, j] != block[s]
                    assert bool((block[s][changed] == args["mask_id"]).all()), "a draft changed an unmasked position"
                    assert _rows_of_ids(drafts[s, j][changed], v), "a draft holds ids outside [0, V)"

    def reference(self, args):
        if confidence_ties(args["logits"], args["block_tokens"], args["mask_id"]):
            return None
        want = reference.spiffy_materialize(args["logits"], args["block_tokens"], args["mask_id"], args["graph_ranks"],
                                            args["graph_child_ptr"], args["graph_children"], args["keep"],
                                            args["temperature"], **_filters(args))
        return None if score_ties(want[2]) else want


class SpiffyAccept(Spec):
    name = "spiffy_accept"
    tensors = {"root_logits": "logits", "draft_logits": "logits_like_root", "draft_blocks": "ids32",
               "node_ids": "ids", "block_tokens": "ids32", "seed": "rng", "offset": "rng", **SAMPLING_TENSORS}
    primary = "root_logits"
    optional = FILTERS

    def valid(self, g):
        n, length, v, k = g.int(0, 3), g.int(1, 5), g.int(2, 20), g.int(0, 3)
        mask_id = g.int(0, v - 1)
        dt = g.pick(LOGITS)
        root = g.logits(n, length, v, dtype=dt)
        block = random_block(g, n, length, v, mask_id)
        args = dict(root_logits=root, draft_logits=g.logits(n, k, length, v, dtype=dt), block_tokens=block,
                    mask_id=mask_id, num_unmask=g.int(1, 2), threshold=g.pick((None, None, 0.5)),
                    temperature=g.temperature(), seed=g.rng_value(), offset=g.rng_value())
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        drafts = block[:, None].repeat(1, k, 1)
        if k and n:  # the first draft is the root's step, so the walk goes on into it
            step = {a: args[a] for a in ("num_unmask", "threshold", "temperature", "seed", "offset") + FILTERS
                    if a in args}
            drafts[:, 0] = xkernels.dllm_step(root, block, mask_id, **step)[0]
        args["draft_blocks"] = drafts
        args["node_ids"] = torch.randint(-1, 4, (n, k), generator=g.g)
        return args

    def value_mutations(self, g, args):
        v = args["root_logits"].shape[-1]
        out = block_mutations(g, args, "block_tokens", v=v) + unmask_mutations(args)
        db = args["draft_blocks"]
        if db.numel():
            out += [(f"draft_blocks id {bad}", _set(args, draft_blocks=_poke(db, bad, g=g.g)), EITHER, set())
                    for bad in (2**40, -3)]
            out.append(("node_ids 2**40", _set(args, node_ids=_poke(args["node_ids"], 2**40, g=g.g)), EITHER, set()))
        return (out + _nonfinite_logits(g, args, "root_logits") + self.sampling_mutations(args) +
                self.rng_mutations(g, args))

    def check(self, args, out):
        root, block, db = args["root_logits"], args["block_tokens"], args["draft_blocks"]
        n, length, v = root.shape
        k = db.shape[1]
        assert block.shape == (n, length) and db.shape == (n, k, length), "accepted mismatched shapes"
        assert args["draft_logits"].shape == (n, k, length, v), "accepted mismatched draft_logits"
        assert _rows_of_ids(block[block != args["mask_id"]], v), "accepted block ids outside [0, V)"
        steps, positions, tokens, new_block, cont = out
        assert steps.shape == cont.shape == (n,) and positions.shape == tokens.shape == new_block.shape == (n, length)
        for s in range(n):
            masked = int((block[s] == args["mask_id"]).sum())
            assert (0 if masked == 0 else 1) <= int(steps[s]) <= max(masked, 1), f"num_steps {int(steps[s])}"
            assert -1 <= int(cont[s]) < k, "continue_from outside [-1, K)"
            c = int((positions[s] >= 0).sum())
            assert bool((positions[s, c:] == -1).all() and (tokens[s, c:] == -1).all()), "not -1 padded"
            assert _rows_of_ids(tokens[s, :c], v), "tokens outside [0, V)"

    def reference(self, args):
        if confidence_ties(args["root_logits"], args["block_tokens"], args["mask_id"]):
            return None
        return reference.spiffy_accept(args["root_logits"], args["draft_logits"], args["draft_blocks"],
                                       args["node_ids"], args["block_tokens"], args["mask_id"], args["num_unmask"],
                                       args["threshold"], args["temperature"], args["seed"], args["offset"],
                                       **_filters(args))


class SpiffyAttentionMask(Spec):
    name = "spiffy_attention_mask"
    tensors = {"prefix_len": "ids"}
    primary = "prefix_len"

    def valid(self, g):
        args = dict(num_drafts=g.int(0, 3), block_size=g.int(1, 4), layout=g.pick(("bool", "packed")))
        if g.coin():
            args["prefix_len"] = g.int(0, 6)
        else:
            lens = g.ids(g.int(0, 3), hi=7)
            args["prefix_len"] = lens
            args["max_prefix_len"] = int(lens.max()) + g.int(0, 2) if lens.numel() else g.int(0, 3)
        return args

    def value_mutations(self, g, args):
        out = [("spiffy_attention_mask(0, 2**30-1, 0, packed)",
                dict(num_drafts=0, block_size=2**30 - 1, prefix_len=0, layout="packed"), RAISE, {"block_size"}),
               ("spiffy_attention_mask(2**40, 2**40, 0)", dict(num_drafts=2**40, block_size=2**40, prefix_len=0),
                RAISE, {"num_drafts", "block_size"}),
               ("spiffy_attention_mask(1, 2, -3)", dict(num_drafts=1, block_size=2, prefix_len=-3), RAISE,
                {"prefix_len"}),
               ("num_drafts=-1", _set(args, num_drafts=-1), RAISE, {"num_drafts"}),
               ("block_size=0", _set(args, block_size=0), RAISE, {"block_size"}),
               ("block_size=2**62", _set(args, block_size=2**62), RAISE, {"block_size"}),
               ("num_drafts=2**62", _set(args, num_drafts=2**62), RAISE, {"num_drafts"}),
               ("layout='dense'", _set(args, layout="dense"), RAISE, {"layout"})]
        if isinstance(args["prefix_len"], int):
            out += [("prefix_len=-1", _set(args, prefix_len=-1), RAISE, {"prefix_len"}),
                    ("prefix_len=2**40", _set(args, prefix_len=2**40), RAISE, {"prefix_len"}),
                    ("max_prefix_len < prefix_len", _set(args, max_prefix_len=args["prefix_len"] - 1), RAISE,
                     {"prefix_len", "max_prefix_len"})]
        else:
            lens = args["prefix_len"]
            out += [("max_prefix_len=-1", _set(args, max_prefix_len=-1), RAISE, {"max_prefix_len"}),
                    ("no max_prefix_len", {k: a for k, a in args.items() if k != "max_prefix_len"}, RAISE,
                     {"max_prefix_len"})]
            if lens.numel():
                out += [(f"prefix_len {bad}", _set(args, prefix_len=_poke(lens, bad, g=g.g)), RAISE,
                         {"prefix_len", "prefix_lens", "max_prefix_len"})
                        for bad in (-1, args["max_prefix_len"] + 1, 2**40)]
        return out

    def check(self, args, out):
        lens = args["prefix_len"]
        q = (1 + args["num_drafts"]) * args["block_size"]
        k = args.get("max_prefix_len", lens if isinstance(lens, int) else 0) + q
        shape = (q, (k + 7) // 8 if args.get("layout") == "packed" else k)
        assert out.shape == (shape if isinstance(lens, int) else (lens.shape[0],) + shape), f"shape {list(out.shape)}"

    def reference(self, args):
        lens = args["prefix_len"]
        single = isinstance(lens, int)
        t = torch.tensor([lens]) if single else lens
        mask = reference.spiffy_attention_mask(t, args["num_drafts"], args["block_size"],
                                               lens if single else args["max_prefix_len"],
                                               args.get("layout") == "packed")
        return mask[0] if single else mask


# ---- vocabulary-parallel sampling ----


class ShardRowStats(Spec):
    name = "shard_row_stats"
    tensors = {"logits": "logits", "rows": "ids", "exclude": "ids", "draft_probs": "f32", "residual_stats": "f32",
               "seed": "rng", "offset": "rng", "temperature": "f32", "cut_value": "f32", "cut_id": "ids32"}
    primary = "logits"
    optional = ("rows", "exclude", "draft_probs", "residual_stats", "cut_value", "cut_id")
    huge_dims = {"logits": (2,)}

    def valid(self, g):
        n, r, v = g.int(0, 3), g.int(0, 5), g.int(0, 20)
        t = g.temperature()
        sample = t > 0 and g.coin(0.7)
        args = dict(logits=g.logits(n, r, v, dtype=g.pick(LOGITS)), vocab_start=g.pick((0, 0, 7, 1000)),
                    ignore_id=g.pick((-1, -1, 3)), sample=sample, raw_stats=g.coin(0.3), temperature=t,
                    seed=g.rng_value(), offset=g.rng_value())
        s = r
        if r and g.coin():
            s = g.int(0, 4)
            args["rows"] = torch.randint(0, r, (n, s), generator=g.g)
        if sample and g.coin():
            args["exclude"] = torch.randint(-1, args["vocab_start"] + v + 1, (n, s, g.int(0, 3)), generator=g.g)
        if sample and g.coin():
            q = g.int(0, r)
            args["draft_probs"] = g.probs(n, q, v) if v else torch.zeros(n, q, 0)
            args["residual_stats"] = torch.stack([torch.full((n, s), 2.0), torch.full((n, s), float(max(v, 1)))], -1)
        if g.coin(0.4):
            args.update(self.sampling_params(g, n))
        if sample and g.coin(0.3):  # any cut: the ids it keeps are what the filters would keep
            args["cut_value"] = torch.randn(n, s, generator=g.g)
            args["cut_id"] = torch.randint(-1, args["vocab_start"] + v + 1, (n, s), generator=g.g)
        return args

    def value_mutations(self, g, args):
        v, r = args["logits"].shape[-1], args["logits"].shape[1]
        out = [("vocab_start=-1", _set(args, vocab_start=-1), RAISE, {"vocab_start"}),
               ("vocab_start=2**31", _set(args, vocab_start=2**31), RAISE, {"vocab_start"}),
               ("vocab_start=2**63-1", _set(args, vocab_start=2**63 - 1), RAISE, {"vocab_start"}),
               ("ignore_id=2**40", _set(args, ignore_id=2**40), EITHER, set())]
        if not torch.is_tensor(args["temperature"]) and args["temperature"] == 0:
            out.append(("sample at T=0", _set(args, sample=True), RAISE, {"sample", "temperature"}))
        if args.get("rows") is not None and args["rows"].numel():
            for bad in (r, -1, 2**40):
                out.append((f"rows {bad}", _set(args, rows=_poke(args["rows"], bad, g=g.g)), RAISE, {"rows"}))
        if args.get("draft_probs") is not None:
            out.append(("draft_probs alone", _set(args, residual_stats=None), RAISE, {"draft_probs", "residual_stats"}))
            out.append(("draft_probs without sample", _set(args, sample=False), RAISE, {"draft_probs", "sample"}))
        if args.get("exclude") is not None and args["exclude"].numel():
            out.append(("exclude 2**40", _set(args, exclude=_poke(args["exclude"], 2**40, g=g.g)), EITHER, set()))
        return out + _nonfinite_logits(g, args, "logits") + self.sampling_mutations(args) + self.rng_mutations(g, args)

    def check(self, args, out):
        logits, vs = args["logits"], args["vocab_start"]
        n, r, v = logits.shape
        rows = args.get("rows")
        s = r if rows is None else rows.shape[1]
        assert rows is None or (rows.shape[0] == n and _rows_of_ids(rows, r)), "accepted rows outside [0, R)"
        row_max, row_sum, top, score, pid, plogit = out
        for t in out:
            assert t.shape == (n, s), f"an output of shape {list(t.shape)}"
        ok = lambda ids: bool((((ids >= vs) & (ids < vs + v)) | (ids == -1)).all())  # noqa: E731
        assert ok(top) and ok(pid), "an id outside the shard"
        assert v == 0 or bool((top >= 0).all()), "top_id -1 on a non-empty shard"
        assert not bool((row_sum < 0).any()), "a negative row_sum"

    def reference(self, args):
        a = dict(args)
        return reference.shard_row_stats(a.pop("logits"), a.pop("vocab_start"), **a)


class ShardCutHistogram(Spec):
    name = "shard_cut_histogram"
    tensors = {"logits": "logits", "scale": "f32", "prefix": "ids", "row_max": "f32", "keep_value": "f32",
               "keep_id": "ids32"}
    primary = "logits"
    optional = ("row_max", "keep_value", "keep_id")
    huge_dims = {"logits": (1,)}

    def valid(self, g):
        r, v = g.int(0, 4), g.int(0, 30)
        logits = g.logits(r, v, dtype=g.pick(LOGITS))
        vs = g.pick((0, 0, 7, 1000))
        scale = torch.rand(r, generator=g.g) * 2
        a = logits.float() * scale[:, None]
        shift = g.pick(CUT_SHIFTS)
        prefix = torch.zeros(r, dtype=torch.int64)
        if shift < 56 and v and g.coin(0.8):  # along a real key: candidates to count
            keys = cut_rank_keys(a, torch.arange(vs, vs + v))
            prefix = keys.gather(1, torch.randint(0, v, (r, 1), generator=g.g))[:, 0] >> (shift + 8)
        elif shift < 56:
            prefix = torch.randint(-(2**62), 2**62, (r,), generator=g.g)
        args = dict(logits=logits, scale=scale, prefix=prefix, shift=shift, vocab_start=vs,
                    ignore_id=g.pick((-1, vs + 1)))
        if g.coin():
            args["row_max"] = a.amax(-1) if v else torch.zeros(r)
        if g.coin(0.3):
            args["keep_value"] = torch.randn(r, generator=g.g)
            args["keep_id"] = torch.randint(-1, vs + v + 1, (r,), generator=g.g)
        return args

    def value_mutations(self, g, args):
        out = [(f"shift={bad}", _set(args, shift=bad), RAISE, {"shift"}) for bad in (-8, 57, 64, 2**40)]
        out += [("vocab_start=-1", _set(args, vocab_start=-1), RAISE, {"vocab_start"}),
                ("vocab_start=2**31", _set(args, vocab_start=2**31), RAISE, {"vocab_start"}),
                ("ignore_id=2**40", _set(args, ignore_id=2**40), EITHER, set()),
                ("prefix -1", _set(args, prefix=torch.full_like(args["prefix"], -1)), EITHER, set())]
        if args.get("keep_value") is not None:
            out.append(("keep_value alone", _set(args, keep_id=None), RAISE, {"keep_value", "keep_id"}))
        if args.get("row_max") is not None and args["row_max"].numel():
            out.append(("row_max below the max", _set(args, row_max=args["row_max"] - 5), EITHER, set()))
            out.append(("row_max NaN", _set(args, row_max=_poke(args["row_max"], math.nan, g=g.g)), EITHER, set()))
        return out + _nonfinite_logits(g, args, "logits")

    def check(self, args, out):
        r, v = args["logits"].shape
        assert out.shape == (r, 2, 256) and out.dtype == torch.int64, f"a histogram of {list(out.shape)}"
        assert bool((out >= 0).all()), "a negative weight"
        assert bool((out[:, 1] < 2**31 * max(v, 1)).all()), "a lo part past its bound"
        assert bool((out[:, 0].sum(1) <= 2**31 * v).all()), "weights past one an id"
        if args.get("row_max") is None:
            assert bool((out[:, 1] == 0).all() and (out[:, 0] % 2**31 == 0).all()), "a count that is not whole"

    def reference(self, args):
        if args.get("row_max") is not None:  # masses: the kernels' exp and torch's differ by ulps (tests compare)
            return None
        a = dict(args)
        return reference.shard_cut_histogram(a.pop("logits"), a.pop("scale"), a.pop("prefix"), a.pop("shift"),
                                             a.pop("vocab_start"), **a)


class ShardCutPick(Spec):
    name = "shard_cut_pick"
    tensors = {"hist": "ids", "prefix": "ids", "before": "ids", "target": "f64"}
    primary = "hist"

    def valid(self, g):
        r, parts = g.int(0, 4), g.pick((1, 2))
        hist = torch.randint(0, 2**31, (r, parts, 256), generator=g.g) * torch.randint(0, 2, (r, parts, 256),
                                                                                      generator=g.g)
        before = torch.randint(0, 2**40, (r, 2), generator=g.g)
        total = cut_weight_values(before[:, :parts, None] + hist.sum(2, keepdim=True))[:, 0]
        target = total * torch.rand(r, generator=g.g, dtype=torch.float64) * g.pick((0.0, 0.5, 1.0, 1.5))
        return dict(hist=hist, prefix=torch.randint(0, 2**40, (r,), generator=g.g), before=before, target=target)

    def value_mutations(self, g, args):
        t = args["target"]
        out = [("target NaN", _set(args, target=torch.full_like(t, math.nan)), EITHER, set()),
               ("target -inf", _set(args, target=torch.full_like(t, -math.inf)), EITHER, set()),
               ("hist negative", _set(args, hist=-args["hist"]), EITHER, set())]
        return out

    def check(self, args, out):
        prefix, before = out
        r = args["hist"].shape[0]
        assert prefix.shape == (r,) and before.shape == (r, 2), f"outputs of {list(prefix.shape)}, {list(before.shape)}"

    def reference(self, args):
        return reference.shard_cut_pick(args["hist"], args["prefix"], args["before"], args["target"])


class ShardCutCandidates(Spec):
    name = "shard_cut_candidates"
    tensors = {"logits": "logits", "scale": "f32", "row_max": "f32"}
    primary = "logits"
    optional = ("row_max",)
    huge_dims = {"logits": (1,)}

    def valid(self, g):
        r, v = g.int(0, 4), g.int(0, 30)
        logits = g.logits(r, v, dtype=g.pick(LOGITS))
        scale = torch.rand(r, generator=g.g) * 2
        args = dict(logits=logits, scale=scale, count=g.pick((0, 1, 3, v, v + 5, 4096)), vocab_start=g.pick((0, 7, 1000)),
                    ignore_id=g.pick((-1, 8)))
        if g.coin():
            args["row_max"] = (logits.float() * scale[:, None]).amax(-1) if v else torch.zeros(r)
        return args

    def value_mutations(self, g, args):
        out = [(f"count={bad}", _set(args, count=bad), RAISE, {"count"}) for bad in (-1, 4097, 2**40)]
        out += [("vocab_start=-1", _set(args, vocab_start=-1), RAISE, {"vocab_start"}),
                ("ignore_id=2**40", _set(args, ignore_id=2**40), EITHER, set())]
        if args.get("row_max") is not None and args["row_max"].numel():
            out.append(("row_max below the max", _set(args, row_max=args["row_max"] - 5), EITHER, set()))
            out.append(("row_max NaN", _set(args, row_max=_poke(args["row_max"], math.nan, g=g.g)), EITHER, set()))
        return out + _nonfinite_logits(g, args, "logits")

    def check(self, args, out):
        keys, weights = out
        r, count = args["logits"].shape[0], args["count"]
        assert keys.shape == (r, count) and keys.dtype == torch.int64, f"keys of {list(keys.shape)}"
        assert bool((keys[:, 1:] > keys[:, :-1]).logical_or(keys[:, 1:] == cut_keep_all_key()).all()), "keys not ascending"
        assert bool((keys >= 0).all()), "a negative key"
        assert weights.shape == (r, count if args.get("row_max") is not None else 0, 2), f"weights of {list(weights.shape)}"
        assert bool((weights >= 0).all() & (weights <= 2**31).all()), "a weight part past its bound"

    def reference(self, args):
        if args.get("row_max") is not None:  # masses: the kernels' exp and torch's differ by ulps (tests compare)
            return None
        a = dict(args)
        return reference.shard_cut_candidates(a.pop("logits"), a.pop("scale"), a.pop("count"), a.pop("vocab_start"),
                                              **a)


SPECS = {s.name: s for s in (ChainVerify(), ChainVerifyRagged(), ChainVerifyRaggedInPlace(), RefineStep(), JacobiRefine(), SequentialRefine(),
                             BuildDraftTree(), TreeAttentionMask(), TreePositions(), TreeVerify(), CompactKv(),
                             DllmStep(), SpiffyMaterialize(), SpiffyAccept(), SpiffyAttentionMask(), ShardRowStats(),
                             ShardCutHistogram(), ShardCutPick(), ShardCutCandidates())}
