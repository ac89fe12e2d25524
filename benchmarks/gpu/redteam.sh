#!/usr/bin/env bash
# The red team on the lent GPU (issue 11, item 7): every fixture of tests/fixtures/redteam (the CPU ones and the
# GPU-only ones), each run once through `python -m kpremote.agent.run.runner --device cuda` on the base task's GPU rows.
# Run from the repository root on a machine with torch, triton, nvidia-ml-py and a GPU (no network, no SSH):
#   bash benchmarks/gpu/redteam.sh [all|cpu|gpu|ATTACK,ATTACK...]      (default all)
# "cpu" runs the attacks that need no GPU (on the GPU), "gpu" the GPU-only ones: two calls that fit the device
# tool's 10-minute limit each build one table, since the work folder keeps the records between calls.
# Environment: OUT (default /tmp/kp-redteam-out) gets redteam.md (the table for docs/redteam.md), redteam.json,
# machine.txt and redteam-logs.tgz (each run's log, summary/ and events); WORK (default /tmp/kp-redteam) holds the
# assembled task folders, run folders and the table so far (REDTEAM_FRESH=1 empties it first);
# REDTEAM_SKIP_DONE=1 leaves out the attacks already recorded there; REDTEAM_RUNNER_ARGS adds runner options; PYTHON (default python3); REDTEAM_DEVICE=cpu tries the script without a
# GPU (CPU attacks, smoke rows). Exit code 0 only when every attack run so far ended as attacks.toml expects.
set -uo pipefail
out=${OUT:-/tmp/kp-redteam-out}
work=${WORK:-/tmp/kp-redteam}
py=${PYTHON:-python3}
mkdir -p "$out"
[ "${REDTEAM_FRESH:-0}" = 1 ] && rm -rf "$work"
mkdir -p "$work"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

args=(run --device "${REDTEAM_DEVICE:-cuda}" --work "$work" --out "$out" --timeout 240)
case "${1:-all}" in
  all|cpu|gpu) args+=(--set "${1:-all}") ;;
  *) args+=(--only "$1") ;;
esac
[ "${REDTEAM_SKIP_DONE:-0}" = 1 ] && args+=(--skip-done)  # a second call goes on where the first stopped
for extra in ${REDTEAM_RUNNER_ARGS:-}; do args+=("--runner-arg=$extra"); done

{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  "$py" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "ncu: $(command -v ncu || echo 'not on PATH')"
  git log -1 --format='commit %H %s' 2>/dev/null
} > "$out/machine.txt" 2>&1

started=$SECONDS
"$py" tests/fixtures/redteam/redteam_kit.py "${args[@]}"
code=$?
echo "red team: $((SECONDS - started)) s, exit $code" | tee -a "$out/machine.txt"

kept=$(cd "$work" && ls -d logs runs/*/summary runs/*/raw/events.jsonl runs/*/raw/workloads 2>/dev/null)
[ -n "$kept" ] && tar czf "$out/redteam-logs.tgz" -C "$work" $kept
exit $code
