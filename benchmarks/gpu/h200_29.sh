#!/usr/bin/env bash
# Harness 2.9 on the lent H200, one device call (issues 25, 28): fuse_scale_shift's small rows in fresh runs, the whole
# task (production rows and regression grid) with the Nsight Compute audit, and the red team's small-row timing
# attacks. Each step through `python -m kpremote.agent.run.runner` on this machine (no SSH: the device time goes to the
# rows), time-boxed, everything under $OUT packed as h200_29.tgz.
#   carry: kernels/h200_diffusion_fuse_scale_shift__multi_shape/baseline/upstream (inv baseline --materialize)
#   bash benchmarks/gpu/h200_29.sh [STEP...]     (default: small full redteam)
# small    FUSE_RUNS (5) runs of the two 4-5 us production rows, audit off, each with fresh side processes, and
#          ONE_PAIR_RUNS (2) with KPREMOTE_SIDE_PAIRS=1 between them (the cost of four pairs, side by side)
# full     every row of the task, audit on (the production rows re-measured by ncu)
# redteam  control_fast and the 10 % forged timer on the red team's ~2 us `tiny` row, audit on (RT_LIST: others)
set -uo pipefail
out=${OUT:-/tmp/kp-29}; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=/tmp/kp-29; rm -rf "$work"; mkdir -p "$work/kernels"
task=h200_diffusion_fuse_scale_shift__multi_shape
cp -r "kernels/$task" "$work/kernels/$task"
trap 'tar czf "$out/h200_29.tgz" -C "$work" --exclude "*/raw/scratch" --exclude "*/raw/build" --exclude "*/task" runs small redteam 2>/dev/null' EXIT
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'from kpremote.agent import harness; print(harness.harness_record())'; } > "$out/machine.txt" 2>&1

run() {  # run NAME SECONDS ARGS...: one runner run of the task into $work/runs/NAME
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" python3 -m kpremote.agent.run.runner --task-dir "$work/kernels/$task" --run-dir "$work/runs/$name" \
    --device cuda --root "$work/root" "$@" > "$work/$name.log" 2>&1
  echo "$name: exit $?, $((SECONDS - t0)) s" | tee -a "$out/steps.txt"
}

step_small() {  # four process pairs (2.9) FUSE_RUNS times; one pair (2.8's timing) ONE_PAIR_RUNS times between them
  local rows=qwen_s19_c3072_bcast11,qwen_s47_c3072_bcast11
  for i in $(seq "${FUSE_RUNS:-5}"); do
    run "small-$i" 90 --workloads "$rows" --audit off
    [ "$i" -le "${ONE_PAIR_RUNS:-2}" ] && KPREMOTE_SIDE_PAIRS=1 run "one-pair-$i" 90 --workloads "$rows" --audit off
  done
}

step_full() { run full "${FULL_S:-240}" --audit on; }

step_redteam() {
  OUT=$work/redteam WORK=/tmp/kp-29-rt REDTEAM_FRESH=1 REDTEAM_WORKLOADS=tiny REDTEAM_RUNNER_ARGS="--audit on" \
    timeout "${RT_S:-150}" bash benchmarks/gpu/redteam.sh \
    "${RT_LIST:-control_fast,forge_event_times_10}" > "$work/redteam.log" 2>&1
  echo "redteam: exit $?" | tee -a "$out/steps.txt"
}

mkdir -p "$work/runs" "$work/small" "$work/redteam"
for step in ${@:-small full redteam}; do "step_$step"; done
