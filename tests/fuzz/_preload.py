"""Imported once by the campaign's fork server, so each child starts warm: torch, the ops, the
references, and the machinery of a first call on the meta device and of torch._dynamo (seconds
each, paid once rather than in every child)."""

import torch
import torch._dynamo  # noqa: F401  (some torch functions the ops' wrappers and references call import it: 4 s)

import xkernels
from tests.fuzz import harness  # noqa: F401

xkernels.tree_positions(torch.zeros(1, 1, dtype=torch.long, device="meta"))
