"""Prints, after the pytest-benchmark tables, one row per case: xkernels vs its reference."""

from collections import defaultdict


def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    cases = defaultdict(dict)
    for bench in session.benchmarks:
        if bench.has_error or not bench:
            continue
        cases[bench.group][bench.extra_info.get("impl", bench.name)] = bench
    write = terminalreporter.write_line
    write("")
    write("baseline: the plain PyTorch reference, or the op named first in the case")
    write(f"{'case':<58} {'baseline ms':>13} {'xkernels ms':>12} {'speed-up':>9}  notes")
    for group in sorted(cases):
        impls = cases[group]
        if "xkernels" not in impls or "reference" not in impls:
            continue
        ours, ref = impls["xkernels"], impls["reference"]
        notes = ", ".join(f"{k}={v}" for k, v in ours.extra_info.items() if k != "impl")
        if "largest_alloc_MB" in ref.extra_info:
            notes += f" (baseline {ref.extra_info['largest_alloc_MB']})"
        write(f"{group:<58} {ref.stats.median * 1e3:>13.3f} {ours.stats.median * 1e3:>12.3f} "
              f"{ref.stats.median / ours.stats.median:>8.1f}x  {notes}")
