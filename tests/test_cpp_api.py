"""The C++ API (tests/cpp, built against the installed package) agrees with the Python wrapper.

tests/run.sh builds the program and sets XKERNELS_CPP_TEST to its path."""

import os
import subprocess

import pytest
import torch

import xkernels

BINARY = os.environ.get("XKERNELS_CPP_TEST")


@pytest.mark.skipif(not BINARY, reason="XKERNELS_CPP_TEST is not set (tests/run.sh builds tests/cpp)")
def test_cpp_api_matches_python():
    lines = subprocess.run([BINARY], check=True, capture_output=True, text=True).stdout.splitlines()
    fields = {line.split()[0]: line.split()[1:] for line in lines}
    torch.manual_seed(0)
    logits = torch.randn(4, 4, 50)
    drafts = torch.randint(0, 50, (4, 3))
    accept_len, out = xkernels.chain_verify(drafts, logits, temperature=1.0, seed=7, offset=3)
    assert [int(x) for x in fields["accept_len"]] == accept_len.tolist()
    assert [int(x) for x in fields["out_tokens"]] == out.flatten().tolist()
    assert fields["build_info"][0] == torch.ops.xkernels.build_info.default()
