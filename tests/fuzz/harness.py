"""The fuzz campaign: cases, mutations, the oracle, and batches run in child processes.

A case is (op, seed, index): a valid call from the op's spec (tests/fuzz/specs.py) with zero to
two mutations, generic ones (a tensor's dtype, rank, sizes, layout, device, container) or the
op's value mutations. Each mutation says what the op must do: raise (a RuntimeError, ValueError
or TypeError whose first line names the argument at fault), either (raise so, or return a result
that keeps the op's contract), or same (return what the unmutated call returns, bit for bit).
Every returned result is checked against the contract, called again to catch uninitialised
outputs, and for unmutated calls (greedy or sampled) compared with xkernels.reference.

Batches run in processes forked from a server that imported torch once, so a crash or a hang
is reported with its case and the campaign goes on after it.

    python -m tests.fuzz.harness --cases 5000            # a campaign, findings grouped
    python -m tests.fuzz.harness --op dllm_step --case 17  # one case, in this process
"""

import argparse
import inspect
import json
import math
import multiprocessing
import os
import random
import re
import sys
import tempfile
import time
import traceback

import torch

from tests.fuzz.specs import EITHER, LOGITS, RAISE, SAME, SPECS, Gen

ERRORS = (RuntimeError, ValueError, TypeError)
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool,
          torch.uint8)
# The dtypes each kind of argument takes (a weight: only w_read's; draft_logits: only root_logits'; probs:
# the verify ops' draft probabilities, the logits' dtypes).
ACCEPTED = {"ids": (torch.int64,), "ids32": (torch.int64, torch.int32), "rng": (torch.int64,), "logits": LOGITS,
            "probs": LOGITS, "f32": (torch.float32,), "f64": (torch.float64,), "i32": (torch.int32,),
            "out_i32": (torch.int32,), "out_f32": (torch.float32,), "weight": (), "logits_like_root": (), "cache": DTYPES}
# Python arguments whose C++ name differs.
ALIASES = {"prefix_len": {"prefix_lens"}, "seed": {"seed_tensor"}, "offset": {"offset_tensor"},
           "graph_ranks": {"graph"}, "graph_child_ptr": {"graph"}, "graph_children": {"graph"},
           "out": {"output_token_ids"}}
HUGE = (2**31 - 1, 2**31, 2**40)
BATCH = 40


# ---- mutations ----


def _tensor_args(spec, args):
    """The tensors a generic mutation may change: not meta ones, nor the huge stride-0 views of a
    value mutation (a copy would not fit)."""
    return [a for a in spec.tensors if isinstance(args.get(a), torch.Tensor) and args[a].device.type != "meta"
            and max([args[a].numel(), *args[a].shape]) <= 2**20]


def _noncontiguous(t, dim):
    """The same values behind strides that are not contiguous ones (every other element of dim)."""
    shape = list(t.shape)
    shape[dim] *= 2
    wide = torch.zeros(shape, dtype=t.dtype)
    index = [slice(None)] * t.dim()
    index[dim] = slice(None, None, 2)
    wide[tuple(index)] = t
    return wide[tuple(index)]


def _expanded(t, dim):
    return t.narrow(dim, 0, 1).expand(t.shape)


def generic_mutations(spec, g, args, last, spare=()):
    """(label, args, expectation, blame) for the tensors of args but spare (what an earlier mutation
    changed); last: the case's last mutation."""
    out = []
    names = set(spec.tensors)
    for a in _tensor_args(spec, args):
        if a in spare:
            continue
        t, kind = args[a], spec.tensors[a]
        blame = {a} | ALIASES.get(a, set())
        dt = g.pick([d for d in DTYPES if d != t.dtype])
        like = {"weight": {"w_read"}, "logits_like_root": {spec.primary}}.get(kind, set())  # whose dtype it must have
        out.append((f"{a} {dt}", {**args, a: t.to(dt)}, EITHER if dt in ACCEPTED[kind] else RAISE, blame | like))
        rank_expect = EITHER if kind == "rng" else RAISE
        out.append((f"{a} unsqueezed", {**args, a: t.unsqueeze(0)}, rank_expect, blame))
        if t.dim():
            dropped = t[..., 0] if t.shape[-1] else torch.zeros(t.shape[:-1], dtype=t.dtype)
            out.append((f"{a} last dim dropped", {**args, a: dropped}, rank_expect, blame))
            d = g.int(0, t.dim() - 1)
            size = g.pick([0, t.shape[d] + 1, max(t.shape[d] - 1, 0), 2 * t.shape[d] + 3])
            shape = list(t.shape)
            shape[d] = size
            resized = torch.zeros(shape, dtype=t.dtype)
            common = [slice(0, min(size, t.shape[d])) if i == d else slice(None) for i in range(t.dim())]
            resized[tuple(common)] = t[tuple(common)]
            out.append((f"{a} dim {d} -> {size}", {**args, a: resized}, EITHER, names | ALIASES.get(a, set())))
            d = g.int(0, t.dim() - (2 if kind == "cache" and t.dim() > 1 else 1))  # a cache's rows are contiguous
            strided = _noncontiguous(t, d)
            dense = RAISE if kind.startswith("out") and not strided.is_contiguous() else SAME  # buffers: contiguous
            out.append((f"{a} non-contiguous in dim {d}", {**args, a: strided}, dense, blame, a))
            wide = [i for i in range(t.dim()) if t.shape[i] > 1]
            if wide:
                d = g.pick(wide)
                expanded = _expanded(t, d)  # written in place, a cache or buffer must not overlap itself
                written = (kind == "cache" or kind.startswith("out")) and not expanded.is_contiguous()
                out.append((f"{a} stride 0 in dim {d}", {**args, a: expanded}, RAISE if written else SAME, blame, a))
            for d, size in spec_huge(spec, a, t, g):
                out.append((f"{a} dim {d} expanded to {size}", {**args, a: _expand_to(t, d, size)}, RAISE,
                            names | ALIASES.get(a, set())))
        others = [b for b in _tensor_args(spec, args) if b != a]  # alone on meta, a call is all on meta
        out.append((f"{a} on meta", {**args, a: t.to("meta")}, RAISE if others else EITHER,
                    blame | {spec.primary} | (names if a == spec.primary else set())))
        if last:  # not tensors: no mutation can follow
            if t.dtype != torch.bfloat16:  # an output buffer must be a tensor
                written = kind.startswith("out") or kind == "cache"
                out.append((f"{a} as numpy", lambda a=a, t=t: {**args, a: t.numpy()}, EITHER if written else SAME,
                            blame, a))
            # a 0-dim tensor's tolist() is a Python number, which a scalar argument takes
            out.append((f"{a} as list", lambda a=a, t=t: {**args, a: t.tolist()}, RAISE if t.dim() else EITHER, blame))
            if a in spec.optional:
                out.append((f"{a} None", {**args, a: None}, EITHER, names))
            elif kind != "rng":
                out.append((f"{a} None", {**args, a: None}, RAISE, blame))
    return out


def spec_huge(spec, name, t, g):
    """Sizes far past the ops' limits (vocabularies, nodes), as stride-0 views costing no memory
    (but never more elements than an int64 counts)."""
    out = []
    for d in spec.huge_dims.get(name, ()):
        size = g.pick(HUGE)
        if d < t.dim() and math.prod(t.shape[:d] + t.shape[d + 1:]) * size < 2**62:
            out.append((d, size))
    return out


def _expand_to(t, dim, size):
    shape = list(t.shape)
    shape[dim] = size
    base = t.narrow(dim, 0, 1) if t.shape[dim] else torch.zeros([1 if i == dim else s for i, s in enumerate(t.shape)],
                                                                   dtype=t.dtype)
    return base.expand(shape)


def _materialised(x):
    return torch.from_numpy(x).clone() if type(x).__module__ == "numpy" else x.contiguous().clone()


def all_meta(spec, args):
    """Every tensor of args on the meta device (and the device of ops that make their own)."""
    out = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    if "device" in inspect.signature(spec.fn).parameters:  # ops that make their tensors
        out["device"] = "meta"
    return out


# ---- the oracle ----


def _copy(t):
    """A copy with t's strides (clone() would make a stride-0 or strided tensor contiguous)."""
    if t.device.type == "meta":
        return t
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())


def _clone(args):
    return {k: (_copy(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _leaves(o)]
    return []


def _equal(a, b):
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if x.shape != y.shape or x.dtype != y.dtype or x.device != y.device:
            return False
        if x.is_floating_point():
            if not bool(((x == y) | (x.isnan() & y.isnan())).all()):
                return False
        elif not torch.equal(x, y):
            return False
    return True


def _close(got, want, rtol=1e-3, atol=1e-4):
    lg, lw = _leaves(got), _leaves(want)
    if len(lg) != len(lw):
        return f"{len(lg)} outputs, the reference has {len(lw)}"
    for i, (x, y) in enumerate(zip(lg, lw)):
        y = y.to(x.device)
        if x.shape != y.shape:
            return f"output {i} has shape {list(x.shape)}, the reference {list(y.shape)}"
        if x.is_floating_point():
            if not torch.allclose(x.float(), y.float(), rtol=rtol, atol=atol, equal_nan=True):
                return f"output {i} differs from the reference: {x.flatten()[:8].tolist()} vs " \
                       f"{y.flatten()[:8].tolist()}"
        elif not torch.equal(x.long(), y.long()):
            return f"output {i} differs from the reference: {x.flatten()[:8].tolist()} vs {y.flatten()[:8].tolist()}"
    return None


def _names_one(message, names):
    first = message.strip().splitlines()[0] if message.strip() else ""
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])", first) for n in names)


def all_names(spec):
    """Every name an argument of the op goes by: the Python entry point's, the schema's, the spec's."""
    schema = getattr(torch.ops.xkernels, spec.schema or spec.name).default._schema
    names = set(spec.tensors) | {a.name for a in schema.arguments} | set(inspect.signature(spec.fn).parameters)
    for a in list(names):
        names |= ALIASES.get(a, set())
    return names


def _call(spec, args):
    try:
        return "returned", spec.call(_clone(args))
    except Exception as e:  # noqa: BLE001 - classified by the oracle
        return "raised", e


def _describe(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def make_case(op, seed, index):
    """(args, labels, expect, blame, base): base is the call a SAME mutation must equal."""
    spec = SPECS[op]
    g = Gen(random.Random(f"{seed}/{op}/{index}"))
    args = spec.valid(g)
    roll = g.r.random()
    labels, expects, blame, base = [], [], set(), None
    if roll < 0.05:  # the fake kernel's shapes, compared with the real call's
        return spec, all_meta(spec, args), ["all on meta"], "meta", blame, args
    count = 0 if roll < 0.15 else 1 if roll < 0.85 else 2
    for j in range(count):
        # The op's value mutations see only valid arguments; generic ones come after them.
        values = spec.value_mutations(g, args) if j == 0 and g.coin(0.5) else []
        choices = values or generic_mutations(spec, g, args, last=j == count - 1, spare=blame)
        if j and labels and first_was_value:  # the value mutation's verdict must stand: keep values
            choices = [c for c in choices if c[2] == RAISE or "non-contiguous" in c[0] or "numpy" in c[0]]
        if not choices:
            continue
        label, new_args, expect, why, *changed = g.pick(choices)
        new_args = new_args() if callable(new_args) else new_args  # a costly conversion, made once picked
        # A SAME mutation must equal the call with its argument materialised (contiguous, a tensor).
        base = {**new_args, changed[0]: _materialised(new_args[changed[0]])} if expect == SAME else None
        if j == 0:
            first_was_value = bool(values)
        labels.append(label)
        expects.append(expect)
        blame |= why
        args = new_args
    expect = RAISE if RAISE in expects else EITHER if EITHER in expects else SAME
    return spec, args, labels, expect, blame, base


def run_case(op, seed, index):
    """The case's verdict: {"outcome": ..., "finding": None or what went wrong}."""
    spec, args, labels, expect, blame, base = make_case(op, seed, index)
    verdict = {"op": op, "index": index, "mutations": labels, "expect": expect, "finding": None}
    blame = blame | {alias for a in blame for alias in ALIASES.get(a, ())}
    start = time.perf_counter()
    kind, out = _call(spec, args)
    verdict["seconds"] = round(time.perf_counter() - start, 3)
    verdict["outcome"] = kind if kind == "returned" else _describe(out)
    finding = None
    if expect == "meta":
        finding = _check_meta(spec, args, kind, out, base)
    elif kind == "raised":
        if not isinstance(out, ERRORS):
            finding = f"raised {type(out).__name__}, not a RuntimeError, ValueError or TypeError"
        elif expect == RAISE and blame and not _names_one(str(out), blame):
            finding = f"the message does not name {sorted(blame)}"
        elif not _names_one(str(out), all_names(spec)):
            finding = "the message names no argument"
        elif expect == SAME:
            finding = _check_same(spec, base, kind, out) if base is not None else "a valid call raised"
    else:
        if expect == RAISE:
            finding = "returned, but the mutation must raise"
        else:
            finding = _check_returned(spec, args, out, labels, expect, base)
    verdict["finding"] = finding
    return verdict


def _check_meta(spec, args, kind, out, real_args):
    """All tensors on meta: the fake kernel's shapes must be the real call's."""
    real_kind, real = _call(spec, real_args)
    if real_kind != "returned":
        return None
    if kind != "returned":
        return f"on meta it raised ({_describe(out)}), on the CPU it returned"
    for x, y in zip(_leaves(out), _leaves(real)):
        if x.device.type != "meta" or x.shape != y.shape or x.dtype != y.dtype:
            return f"on meta an output is {x.device} {x.dtype} {list(x.shape)}, on the CPU {y.dtype} {list(y.shape)}"
    return None


def _device_of(spec, args):
    t = args.get(spec.primary)
    return t.device if isinstance(t, torch.Tensor) else torch.device("cpu")


def _check_returned(spec, args, out, labels, expect, base):
    device = _device_of(spec, args)
    for t in _leaves(out):
        if t.device != device:
            return f"an output is on {t.device}, the inputs on {device}"
    if device.type == "meta":
        return None
    checked = {k: (torch.from_numpy(v) if type(v).__module__ == "numpy" else v) for k, v in args.items()}
    try:
        spec.check(checked, out)
    except AssertionError as e:
        return f"contract: {e}"
    again = _call(spec, args)
    if again[0] != "returned" or not _equal(again[1], out):
        return "a second identical call returned something else (uninitialised outputs?)"
    if base is not None:
        found = _check_same(spec, base, "returned", out)
        if found:
            return found
    if not labels or expect == SAME:  # greedy or sampled: the references draw the kernels' Philox noise
        ref_args = checked if base is None else base
        want = spec.reference(ref_args)
        if want is not None:
            diff = _close(out, want, *spec.tolerance(ref_args))
            if diff:
                return diff
    return None


def _check_same(spec, base, kind, out):
    base_kind, want = _call(spec, base)
    if base_kind != kind:
        return f"the unmutated call {base_kind}, this one {kind}"
    if kind == "returned" and not _equal(out, want):
        return "the result differs from the unmutated call's"
    return None


# ---- batches in child processes ----


def run_batch(op, seed, first, count, path, runner=run_case):
    """Runs cases first..first+count-1 through runner (op, seed, index) -> verdict, one JSON line
    each; a line "start" before each case."""
    torch.set_num_threads(1)
    with open(path, "a") as f:
        for index in range(first, first + count):
            f.write(json.dumps({"start": index}) + "\n")
            f.flush()
            try:
                verdict = runner(op, seed, index)
            except Exception:  # noqa: BLE001 - a bug of the campaign itself is a finding too
                verdict = {"op": op, "index": index, "finding": "harness error: " + traceback.format_exc()[-1500:],
                           "mutations": [], "expect": "?", "outcome": "?"}
            f.write(json.dumps(verdict) + "\n")
            f.flush()


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["tests.fuzz._preload"])
    return _CONTEXT


def campaign(op, seed, cases, timeout=120.0, runner=run_case, batch=BATCH):
    """Every verdict of cases 0..cases-1 of op, each batch in a child; a crash or hang is a verdict too."""
    verdicts = []
    index = 0
    with tempfile.TemporaryDirectory() as tmp:
        while index < cases:
            count = min(batch, cases - index)
            path = os.path.join(tmp, f"{op}-{index}.jsonl")
            child = _context().Process(target=run_batch, args=(op, seed, index, count, path, runner))
            child.start()
            child.join(timeout)
            hung = child.is_alive()
            if hung:
                child.kill()
                child.join()
            lines = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
            done = [v for v in lines if "start" not in v]
            verdicts += done
            started = [v["start"] for v in lines if "start" in v]
            last = started[-1] if started else index
            if len(done) < count:
                what = f"hung (over {timeout:.0f} s for the batch)" if hung else f"crashed (exit code {child.exitcode})"
                spec, args, labels, expect, _, _ = make_case(op, seed, last)
                verdicts.append({"op": op, "index": last, "mutations": labels, "expect": expect, "outcome": what,
                                 "finding": f"the process {what}"})
                index = last + 1
            else:
                index += count
    return verdicts


def describe(v, seed):
    return (f"{v['op']} case {v['index']} (seed {seed}) {v['mutations']} expect {v['expect']}: {v['finding']}; "
            f"got {v['outcome']}\n    rerun: python -m tests.fuzz.harness --op {v['op']} --seed {seed} "
            f"--case {v['index']}")


def summary(verdicts):
    by = {}
    for v in verdicts:
        key = "returned" if v["outcome"] == "returned" else "raised" if ":" in v["outcome"] else v["outcome"]
        by[key] = by.get(key, 0) + 1
    return by


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", action="append", help="an op (default: every op); repeatable")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=200, help="cases per op")
    parser.add_argument("--case", type=int, help="run this one case here and show it")
    opts = parser.parse_args()
    ops = opts.op or sorted(SPECS)
    if opts.case is not None:
        for op in ops:
            spec, args, labels, expect, blame, base = make_case(op, opts.seed, opts.case)
            print(f"{op} case {opts.case}: mutations {labels}, expect {expect}, blame {sorted(blame)}")
            for k, a in args.items():
                print(f"  {k} = {a!r}"[:400])
            print(json.dumps(run_case(op, opts.seed, opts.case), indent=1))
        return
    total, findings = 0, []
    for op in ops:
        start = time.perf_counter()
        verdicts = campaign(op, opts.seed, opts.cases)
        total += len(verdicts)
        bad = [v for v in verdicts if v["finding"]]
        findings += bad
        print(f"{op}: {len(verdicts)} cases in {time.perf_counter() - start:.1f} s, {summary(verdicts)}, "
              f"{len(bad)} findings", flush=True)
    print(f"{total} cases, {len(findings)} findings")
    groups = {}
    for v in findings:  # one example of each (op, kind of finding, first mutation's kind)
        label = re.sub(r"[-\d*]+", "#", v["mutations"][0] if v["mutations"] else "")
        groups.setdefault((v["op"], re.sub(r"[-\d.e+]+", "#", v["finding"][:80]), label), []).append(v)
    for key, vs in sorted(groups.items()):
        print(f"[{len(vs)}x] " + describe(vs[0], opts.seed))
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
