#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the CPU benchmark suite: each op against its
# plain PyTorch reference in the same run, with the speed-up in the last table.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/env.sh"
cd "$XK_ROOT/bench"
"$XK_PY" -m pytest . "$@"
