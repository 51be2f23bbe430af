"""Options of the fuzz campaign: `python -m pytest tests/fuzz --fuzz-cases N [--fuzz-seed S]`."""

# The CI campaign, seed 0: cases per op (6,000 cases in all, each one to four calls), about 50 s on
# two cores.
CI_CASES_PER_OP = 400


def pytest_addoption(parser):
    parser.addoption("--fuzz-cases", type=int, default=None,
                     help=f"fuzz cases per op (default {CI_CASES_PER_OP}, the CI campaign)")
    parser.addoption("--fuzz-seed", type=int, default=0, help="the fuzz campaign's seed (default 0)")
