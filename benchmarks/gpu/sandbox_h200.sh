#!/usr/bin/env bash
# Harness 2.8 on the lent GPU (issues 24, 25, 33): the sandbox against the red team, the one-sided audit on small
# rows, and what the sandbox costs. From the repository root on the GPU machine (device tool):
#   bash benchmarks/gpu/sandbox_h200.sh [STEP...]        (default: redteam cost)
# redteam  the sandbox attacks (issue 24), the timing attacks and both controls on the base task's "mid" row, each
#          through `python -m kpremote.agent.run.runner` (benchmarks/gpu/redteam.sh) -> $OUT/rt/ (RT_LIST: other attacks;
#          RT_S: seconds for the step, default 420)
# small    the timing attacks (forged event times, side stream, late launches) and both controls on the "tiny" row
#          (a few µs) with the Nsight Compute audit on -> $OUT/small/ (SMALL_LIST, SMALL_S likewise)
# cost     the control_same task's "mid" row, sandboxed and with KPREMOTE_SANDBOX=off, alternating, COST_RUNS times
#          each (default 3): wall seconds of the whole run -> $OUT/cost.txt
# Everything lands in $OUT (the device tool's), packed as sandbox.tgz.
set -uo pipefail
out=${OUT:-/tmp/kp-28}; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
trap 'tar czf "$out/sandbox.tgz" -C "$out" --exclude sandbox.tgz . 2>/dev/null' EXIT
SANDBOX_ATTACKS=plant_pyc_adapter,plant_pyc_baseline,forge_records,daemon_left_behind,signal_baseline,renice_baseline,helper_thread_poison
TIMING_ATTACKS=forge_event_times_30,forge_event_times_10,side_stream,background_thread,patch_timer_stats,sleep_first_call,persisting_l2
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
  python3 -c 'from kpremote.agent import sandbox, harness; print(sandbox.support().to_json(), harness.harness_record())'
} > "$out/machine.txt" 2>&1

step_redteam() {
  OUT=$out/rt WORK=/tmp/kp-rt REDTEAM_FRESH=1 timeout "${RT_S:-420}" bash benchmarks/gpu/redteam.sh \
    "${RT_LIST:-control_fast,control_same,$SANDBOX_ATTACKS,$TIMING_ATTACKS}"
  echo "redteam: exit $?" >> "$out/steps.txt"
}

step_small() {
  OUT=$out/small WORK=/tmp/kp-small REDTEAM_FRESH=1 REDTEAM_WORKLOADS=tiny REDTEAM_RUNNER_ARGS="--audit on" \
    timeout "${SMALL_S:-420}" bash benchmarks/gpu/redteam.sh "${SMALL_LIST:-control_fast,control_same,$TIMING_ATTACKS}"
  echo "small: exit $?" >> "$out/steps.txt"
}

step_cost() {
  local task=/tmp/kp-cost/kernels/redteam_control_same i mode t0
  python3 -c 'import sys; sys.path.insert(0, "tests/fixtures/redteam"); import redteam_kit as k, pathlib
k.assemble(next(a for a in k.load_attacks() if a.id == "control_same"), pathlib.Path("/tmp/kp-cost/kernels"))'
  for i in $(seq "${COST_RUNS:-3}"); do
    for mode in on off; do
      t0=$(date +%s.%N)
      KPREMOTE_SANDBOX=$mode python3 -m kpremote.agent.run.runner --task-dir $task --run-dir /tmp/kp-cost/runs/$mode-$i \
        --device cuda --root /tmp/kp-cost/root --workloads mid --audit off > "$out/cost-$mode-$i.log" 2>&1
      echo "$mode $i exit $? $(python3 -c "import time; print(round(time.time() - $t0, 2))") s" | tee -a "$out/cost.txt"
    done
  done
}

for step in ${@:-redteam cost}; do "step_$step"; done
