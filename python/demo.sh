#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the demo on the shipped models:
# held-out code and math prompts decoded by every mode, with tables, demo_out/demo.png and
# demo_out/demo.json. Options go to `python -m xkernels demo` (see --help).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tests/env.sh"
cd "$XK_ROOT"
"$XK_PY" -m xkernels demo "$@"
