"""The fuzz campaign's cases on the CUDA kernels under the emulation (tests/cuda_emu/fuzz_emu.py):
what the CPU accepts keeps the op's contract, what only the CPU's value checks refuse stays in
bounds; each batch in a child process, so an ASan report is a failure named with its case."""

import pytest

from tests.cuda_emu import fuzz_emu
from tests.fuzz import harness

CASES_PER_OP = 100  # about a third launch (the rest the shared checks refuse); ~1 min on two cores


@pytest.mark.parametrize("op", sorted(fuzz_emu.LAUNCHES))
def test_fuzz_campaign_on_the_emulated_kernels(op):
    verdicts = harness.campaign(op, 0, CASES_PER_OP, timeout=600.0, runner=fuzz_emu.run_case, batch=CASES_PER_OP)
    findings = [harness.describe(v, 0) for v in verdicts if v["finding"]]
    launched = [v for v in verdicts if v["outcome"] != "skipped"]
    assert not findings, f"{len(findings)} findings:\n" + "\n".join(findings[:20])
    assert len(launched) >= CASES_PER_OP // 8, f"only {len(launched)} of {CASES_PER_OP} cases launched"
