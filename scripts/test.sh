#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system tools for the SSH rig, the venv, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v rsync >/dev/null || need+=(rsync)
command -v ip >/dev/null || need+=(iproute2)
# tests/slurm_rig.py: a one-node Slurm with munge (tests/test_slurm.py)
for daemon in slurmctld slurmd munged; do [ -x /usr/sbin/$daemon ] || need+=("${daemon/munged/munge}"); done
command -v sbatch >/dev/null || need+=(slurm-client)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
bash scripts/setup.sh
# The checkout's own modules compiled once, here: with PYTHONDONTWRITEBYTECODE set (as on the 2-core machine) no
# process writes them, so every `inv`, agent, judge and side process the tests start would compile kpremote/ from
# source again (~5-8 % of their CPU). __pycache__ is git-ignored, and never shipped, synced or fingerprinted.
.venv/bin/python -m compileall -q kpremote tasks.py >/dev/null
# Two pytest-xdist workers run the test files side by side, a file whole on one worker (its module fixtures are made
# once), handed out in collection order: tests/conftest.py puts the slowest files first (SLOWEST_FIRST), and
# --no-loadscope-reorder keeps xdist from re-sorting them by test count. Arguments given later win: `-n 0` runs
# everything in this one process.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
