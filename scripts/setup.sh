#!/usr/bin/env bash
# Make .venv with kpremote and what it needs. Idempotent; used by both quick-start commands.
# torch: a machine that already has torch (a GPU host) keeps its own; elsewhere the CPU build 2.13.0 is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv --system-site-packages .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
.venv/bin/python -c "import triton" 2>/dev/null || "${pip[@]}" "triton>=3.0"
"${pip[@]}" -e ".[dev]"
