"""The profile step's table: Nsight Compute's raw CSV of the xkernels kernels, one line a kernel.

    python bench/ncu_table.py ncu.csv    the table (exit 3 where the file holds no kernel row)
    python bench/ncu_table.py --metrics  the metrics to ask ncu for, comma-separated

bench/gpu_check.sh runs `ncu --csv --page raw --print-units base --nvtx --metrics $(... --metrics)`
over `bench/gpu_bench.py --profile-once`, whose NVTX range around each case's one call names the
case. Under each case's line, a line a kernel: its launches in that call, their summed duration,
its grid (blocks), and of its first launch the DRAM throughput and the SM throughput (% of peak), the achieved occupancy (% of the
warps an SM holds), registers a thread, shared memory a block (static + dynamic) and the three
largest warp-stall reasons (cycles a warp spends stalled on each, per issued instruction).
"""

import csv
import re
import sys

DURATION = "gpu__time_duration.sum"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"
SHARED = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
# Nsight Compute's warp-state reasons; `selected` (issuing) is no stall.
STALLS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
          "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected",
          "short_scoreboard", "sleeping", "tex_throttle", "wait")
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
METRICS = (DURATION, DRAM, SM, OCCUPANCY, REGISTERS, *SHARED, *(STALL.format(s) for s in STALLS))
NVTX = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
TO_MICROSECONDS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}
TO_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "KB": 1e3, "KiB": 1024}


def read(path):
    """(units by metric, rows as dicts) of a raw-page CSV; ncu's own lines (==PROF==, ==WARNING==)
    before the header are skipped."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return {}, []
    table = list(csv.DictReader(lines[start:]))
    if not table:
        return {}, []
    units = table[0] if not table[0]["ID"] else {}  # the row under the header: each metric's unit
    return units, [row for row in table if row["ID"].strip().isdigit()]


def number(text):
    """A metric's value (ncu may group thousands with commas); None where it is absent or n/a."""
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def case_of(row):
    """The innermost NVTX range around the launch: the case's label (gpu_bench.py --profile-once)."""
    ranges = re.findall(r"<default domain>:([^:]*):", row.get(NVTX) or "")
    return ranges[-1] if ranges else ""


def kernel_of(row):
    """The kernel's name without its return type, parameters, the xkernels and anonymous namespaces."""
    name = row["Kernel Name"]
    depth, cut = 0, len(name)
    for i, c in enumerate(name):  # the parameter list: the last top-level '(' (templates nest '<>')
        depth += c in "<[" and 1 or c in ">]" and -1 or 0
        if c == "(" and depth == 0 and not name.startswith("(anonymous namespace)", i):
            cut = i
    name = name[:cut] if cut else name
    name = re.sub(r"^void |\(anonymous namespace\)::|xkernels::(cuda::)?", "", name.strip())
    return name.replace("__nv_bfloat16", "bf16").replace("(bool)1", "true").replace("(bool)0", "false")


def value(row, units, metric, scale=None):
    v = number(row.get(metric, ""))
    if v is None or scale is None:
        return v
    factor = scale.get(units.get(metric, ""))
    return None if factor is None else v * factor


def stalls(row, top=3):
    found = [(value(row, {}, STALL.format(s)), s) for s in STALLS]
    found = sorted(((v, s) for v, s in found if v), reverse=True)[:top]
    return " ".join(f"{s} {v:.1f}" for v, s in found)


def blocks(row):
    """The grid's block count, from ncu's "(x, y, z)"."""
    sizes = [number(x) for x in re.findall(r"[\d,]+", row.get("Grid Size", ""))]
    total = 1
    for x in sizes:
        total *= x or 0
    return f"{total:.0f}" if sizes else ""


def lines(units, rows):
    """The table's lines, in launch order: a case's line, then its kernels' (the launches of one
    kernel in one case merged, their durations summed)."""
    merged = {}
    for row in rows:
        key = (case_of(row), kernel_of(row))
        duration = value(row, units, DURATION, TO_MICROSECONDS)
        if key in merged:
            merged[key][0] += 1
            merged[key][1] = None if None in (merged[key][1], duration) else merged[key][1] + duration
        else:
            merged[key] = [1, duration, row]
    fmt = "  {:<52.52} {:>3} {:>9} {:>6} {:>5} {:>5} {:>5} {:>4} {:>6}  {}"
    out = [fmt.format("kernel", "x", "us", "blocks", "dram%", "sm%", "occ%", "regs", "smemKB", "top stalls")]
    pct = lambda v: "" if v is None else f"{v:.0f}"  # noqa: E731
    case = None
    for (row_case, kernel), (count, duration, row) in merged.items():
        if row_case != case:
            case = row_case
            out.append(case or "(no NVTX range)")
        shared = [value(row, units, m, TO_BYTES) for m in SHARED]
        regs = value(row, units, REGISTERS)
        out.append(fmt.format(kernel, count, "" if duration is None else f"{duration:.1f}", blocks(row),
                              pct(value(row, units, DRAM)), pct(value(row, units, SM)),
                              pct(value(row, units, OCCUPANCY)), "" if regs is None else f"{regs:.0f}",
                              "" if None in shared else f"{sum(shared) / 1024:.1f}", stalls(row)))
    return out


def main(argv):
    if argv == ["--metrics"]:
        print(",".join(METRICS))
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    units, rows = read(argv[0])
    if not rows:
        print(f"{argv[0]}: no kernel rows", file=sys.stderr)
        return 3
    print("\n".join(lines(units, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
