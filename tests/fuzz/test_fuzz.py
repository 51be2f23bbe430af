"""The fuzz campaign over every public op (tests/fuzz/harness.py): a fixed-seed campaign in CI,
longer ones by hand with --fuzz-cases and --fuzz-seed."""

import inspect

import pytest

import xkernels.ops
from tests.fuzz import harness
from tests.fuzz.conftest import CI_CASES_PER_OP
from tests.fuzz.specs import SPECS


def test_every_public_op_has_a_spec():
    public = {name for name, f in vars(xkernels.ops).items()
              if inspect.isfunction(f) and f.__module__ == "xkernels.ops" and not name.startswith("_")}
    missing = public - {"build_info"} - set(SPECS)
    assert not missing, f"ops without a fuzz spec (tests/fuzz/specs.py): {sorted(missing)}"


@pytest.mark.parametrize("op", sorted(SPECS))
def test_fuzz_campaign(op, request):
    cases = request.config.getoption("fuzz_cases", default=None) or CI_CASES_PER_OP
    seed = request.config.getoption("fuzz_seed", default=None) or 0
    verdicts = harness.campaign(op, seed, cases)
    assert len(verdicts) == cases
    findings = [harness.describe(v, seed) for v in verdicts if v["finding"]]
    assert not findings, f"{len(findings)} findings of {cases} cases:\n" + "\n".join(findings[:30])
