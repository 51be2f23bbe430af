"""The fuzz campaign of tests/fuzz, run on the CUDA kernels under the emulation (ASan, UBSan).

The CUDA bindings share the CPU's metadata checks (csrc/ops/checks.cpp) but skip the value checks
that need a host read unless XKERNELS_CHECK=1. So each case is first called on the CPU:
- it returns: the launchers must return a result that keeps the op's contract (exactly the CPU's
  for the ops without float arithmetic);
- it raises a value check (ids, trees, graphs, rows, paths): the launchers get those values as the
  binding would pass them and must stay in bounds (ASan reports any stray access: a crash, named
  with its case) with outputs in range;
- it raises otherwise: the binding raises the same; nothing to launch.
"""

import re

import torch

from tests.cuda_emu.emu import CudaEmu, EmuViolation, LaunchError
from tests.fuzz import harness
from tests.fuzz.specs import SPECS, graph_ns
from xkernels.reference.sampling import is_per_row

# The value checks of the CPU kernels, which CUDA makes only under XKERNELS_CHECK=1.
VALUE_CHECKS = re.compile(r"holds ids outside|holds row indices outside|is not a valid tree|\(the root\) must be -1|"
                          r"num_nodes must lie in|^graph_ranks: |^graph_child_ptr must (run|be non)|^graph_children: |"
                          r"^prefix_lens\[|^accept_len must lie|^path must be increasing|in every row$")
# The arguments of chain_verify's per-row form, whose kernel (chain_verify_ragged's) is not launched here.
ENGINE_FORM = ("top_k", "top_p", "min_p", "method", "return_logprobs")
NUMBERS = ("temperature", "threshold", "seed", "offset", "prefix_len")
_EMU = []


def _emu():
    if not _EMU:
        _EMU.append(CudaEmu())
    return _EMU[0]


def _int(x):
    return int(x.reshape(-1)[0]) if isinstance(x, torch.Tensor) else int(x)


def _rng(x):
    """A seed or offset as the launchers take it: a tensor (one element or [N]) or an int."""
    return x if isinstance(x, torch.Tensor) else int(x)


def _weights(a):
    from xkernels import RefinerWeights

    return RefinerWeights(*(a[k] for k in RefinerWeights._fields))


def _filters(a):
    return {k: a[k] for k in ("top_k", "top_p", "min_p") if k in a}


def _refine(op):
    def launch(emu, a):
        tokens = a["prev_tokens"] if op == "refine_step" else a["prefix_tokens"]
        out = emu.refine(op, a["ctx"], tokens, a["base_logits"], _weights(a), a["temperature"], _rng(a["seed"]),
                         _rng(a["offset"]), max_iters=a.get("max_iters", 0), **_filters(a))
        return out if op == "jacobi_refine" else out[:2]
    return launch


def _spiffy_mask(emu, a):
    lens = a["prefix_len"]
    single = isinstance(lens, int)
    t = torch.tensor([lens]) if single else lens
    mask = emu.spiffy_attention_mask(t, a["num_drafts"], a["block_size"], lens if single else a["max_prefix_len"],
                                     a.get("layout") == "packed")
    return mask[0] if single else mask


# op -> (launch(emu, args) -> the op's outputs, whether they must equal the CPU's exactly)
LAUNCHES = {
    "chain_verify": (lambda emu, a: emu.chain_verify(a["draft_tokens"], a["target_logits"], a.get("draft_probs"),
                                                     a["temperature"], _int(a["seed"]), _int(a["offset"])), False),
    "refine_step": (_refine("refine_step"), False),
    "jacobi_refine": (_refine("jacobi_refine"), False),
    "sequential_refine": (_refine("sequential_refine"), False),
    "build_draft_tree": (lambda emu, a: emu.build_draft_tree(a["topk_logprobs"], a["topk_tokens"], a["budget"],
                                                             a.get("mask")), True),
    "tree_attention_mask": (lambda emu, a: emu.tree_mask(a["parents"], a.get("num_nodes"), a["layout"] == "packed"),
                            True),
    "tree_positions": (lambda emu, a: emu.tree_mask(a["parents"], a.get("num_nodes"), positions=True), True),
    "tree_verify": (lambda emu, a: emu.tree_verify(a["tokens"], a["parents"], a["target_logits"], a.get("draft_probs"),
                                                   a["without_replacement"], a["temperature"], _rng(a["seed"]),
                                                   _rng(a["offset"]), a.get("num_nodes"), **_filters(a)), False),
    "compact_kv_": (lambda emu, a: emu.compact_kv(a["cache"], a["path"], a["accept_len"], a["prefix_len"]), True),
    "dllm_step": (lambda emu, a: emu.dllm_step(a["logits"], a["block_tokens"], a["mask_id"], a["num_unmask"],
                                               a["threshold"], a["temperature"], _rng(a["seed"]),
                                               _rng(a["offset"]), **_filters(a)), False),
    "spiffy_materialize": (lambda emu, a: emu.spiffy_materialize(
        a["logits"], a["block_tokens"], a["mask_id"], graph_ns(a["graph_ranks"], a["graph_child_ptr"],
                                                               a["graph_children"]), a["keep"], a["temperature"],
        **_filters(a)), False),
    "spiffy_accept": (lambda emu, a: emu.spiffy_accept(
        a["root_logits"], a["draft_logits"], a["draft_blocks"], a["node_ids"], a["block_tokens"], a["mask_id"],
        a["num_unmask"], a["threshold"], a["temperature"], _rng(a["seed"]), _rng(a["offset"]), **_filters(a)), False),
    "spiffy_attention_mask": (_spiffy_mask, True),
    "shard_row_stats": (lambda emu, a: emu.shard_row_stats(
        a["logits"], a["vocab_start"], a.get("rows"), a.get("exclude"), a.get("draft_probs"), a.get("residual_stats"),
        a["ignore_id"], a["sample"], a["raw_stats"], 0.0 if torch.is_tensor(a["temperature"]) else a["temperature"],
        temperature_tensor=a["temperature"] if torch.is_tensor(a["temperature"]) else None,
        seed_tensor=a["seed"] if torch.is_tensor(a["seed"]) else None,
        offset_tensor=a["offset"] if torch.is_tensor(a["offset"]) else None,
        seed=0 if torch.is_tensor(a["seed"]) else _int(a["seed"]),
        offset=0 if torch.is_tensor(a["offset"]) else _int(a["offset"]),
        cut_value=a.get("cut_value"), cut_id=a.get("cut_id")), False),
    "shard_cut_histogram": (lambda emu, a: emu.shard_cut_histogram(
        a["logits"], a["scale"], a["prefix"], a["shift"], a["vocab_start"], a["ignore_id"], a.get("row_max"),
        a.get("keep_value"), a.get("keep_id")), False),
    "shard_cut_pick": (lambda emu, a: emu.shard_cut_pick(a["hist"], a["prefix"], a["before"], a["target"]), True),
    "shard_cut_candidates": (lambda emu, a: emu.shard_cut_candidates(
        a["logits"], a["scale"], a["count"], a["vocab_start"], a["ignore_id"], a.get("row_max")), False),
}
# Ops whose int outputs are radix keys and fixed-point sums (up to 2^63), not sizes or ids: no bound.
UNBOUNDED = ("shard_cut_histogram", "shard_cut_pick", "shard_cut_candidates")


def _per_row_form(k, v, n):
    """Whether argument k = v sends chain_verify to its per-row form (chain_verify_ragged's kernel)."""
    return (k in ENGINE_FORM and v is not None) or (k == "temperature" and isinstance(v, torch.Tensor)) or (
        k in ("seed", "offset") and is_per_row(v, n))


def _launchable(spec, args):
    """The arguments as the binding would launch them (NumPy arrays as tensors), or None for a call
    no launch follows: a tensor or device off the CPU, a list, a number given as a string, a
    required tensor missing, chain_verify's per-row form (another op)."""
    n = spec.batch(args)
    out = {}
    for k, v in args.items():
        if type(v).__module__ == "numpy":
            v = torch.from_numpy(v)
        if isinstance(v, torch.Tensor) and v.dtype == torch.int32 and spec.tensors.get(k) == "ids32":
            v = v.long()  # the Python wrappers widen int32 ids before the op: the launch sees int64
        if (isinstance(v, torch.Tensor) and v.device.type != "cpu") or isinstance(v, list) or (
                k in NUMBERS and isinstance(v, str)) or (k == "device" and v is not None) or (
                spec.name == "chain_verify" and _per_row_form(k, v, n)) or (
                k in spec.tensors and k not in spec.optional and v is None):
            return None
        out[k] = v
    return out


def _bound(args):
    """A bound no int output may reach in magnitude: the sum of every size, id and int the
    arguments hold (unchecked ids are copied as they are, a shard's ids are offset); uninitialised
    memory lies far past it."""
    sizes = [s for v in args.values() if isinstance(v, torch.Tensor) for s in v.shape]
    values = [int(v.abs().max()) for v in args.values() if isinstance(v, torch.Tensor) and v.numel()
              and not v.is_floating_point() and v.dtype != torch.bool]
    ints = [abs(v) for v in args.values() if isinstance(v, int) and not isinstance(v, bool)]
    return sum(sizes + values + ints) + 2


def run_case(op, seed, index):
    """The verdict of case (op, seed, index) on the emulated CUDA kernels."""
    spec, args, labels, _, _, _ = harness.make_case(op, seed, index)
    verdict = {"op": op, "index": index, "mutations": labels, "expect": "emu", "finding": None, "outcome": "skipped"}
    args = _launchable(spec, args)
    if args is None or op not in LAUNCHES:
        return verdict
    kind, cpu = harness._call(spec, args)
    unchecked = kind == "raised" and VALUE_CHECKS.search(str(cpu))
    if kind == "raised" and not unchecked:
        return verdict
    launch, exact = LAUNCHES[op]
    try:
        got = launch(_emu(), harness._clone(args))
    except EmuViolation as e:
        verdict["finding"] = f"a CUDA rule broken: {str(e)[:300]}"
        return verdict
    except LaunchError as e:
        cpu_did = "raised a value check" if unchecked else "returned"
        verdict["finding"] = f"the launch failed where the CPU {cpu_did}: {e}"
        return verdict
    verdict["outcome"] = "unchecked values, launched" if unchecked else "launched"
    bound = _bound(args)
    for t in harness._leaves(got) if op not in UNBOUNDED else ():
        ids = not t.is_floating_point() and t.dtype not in (torch.bool, torch.uint8)  # uint8: a packed mask's bits
        if ids and t.numel() and int(t.abs().max()) >= bound:
            verdict["finding"] = f"an output holds {int(t.abs().max())} (uninitialised?), past every size and id"
            return verdict
    if not unchecked:
        try:
            spec.check(args, got)
        except AssertionError as e:
            verdict["finding"] = f"contract: {e}"
            return verdict
        if exact and not harness._equal([t.to(c.dtype) for t, c in zip(harness._leaves(got), harness._leaves(cpu))],
                                        harness._leaves(cpu)):
            verdict["finding"] = "the emulated CUDA result differs from the CPU's"
    return verdict
