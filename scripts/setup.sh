#!/usr/bin/env bash
# Make .venv with kpremote and what it needs. Idempotent; used by both quick-start commands.
# torch: a machine that already has torch (a GPU host) keeps its own; elsewhere the CPU build 2.13.0 is installed.
# Each install says what it installs first (on stderr): the first one is long, and silence reads as a hang.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
say() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "making .venv"
  "$python" -m venv --system-site-packages .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  say "installing torch 2.13.0 into .venv (the CPU build where no torch is installed; a large download the first time)"
  "${pip[@]}" "torch==2.13.0"
fi
if ! .venv/bin/python -c "import triton" 2>/dev/null; then
  say "installing triton into .venv"
  "${pip[@]}" "triton>=3.0"
fi
# The editable install, again only when pyproject.toml changed since the last one (its sha256 kept in .venv):
# a quick start after the first does not pay pip's 30 s for nothing.
stamp=.venv/.kpremote-pyproject.sha256
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  say "installing kpremote and its dependencies into .venv (pip install -e '.[dev]')"
  "${pip[@]}" -e ".[dev]"
  echo "$wanted" > "$stamp"
else
  say "kpremote already installed in .venv (pyproject.toml unchanged)"
fi
say "done"
