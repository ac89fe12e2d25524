#!/usr/bin/env bash
# The trusted harness on the lent H200 (issue 11's cost figures and the refreshed task results), as a user runs it.
# From the repository root on the GPU machine (device tool; carry .gpuhost, .oldharness and .gpustage):
#   bash benchmarks/gpu/trust_h200.sh [STEP...]        (default: refresh cost)
# refresh  `inv run` over SSH of each shipped task's production rows (Nsight Compute audit on, the default), then
#          the fetched results.md/json
# cost     the same production rows of the fuse_scale_shift task (the pre-trust task folder in .oldharness, so the
#          kernels are identical) through the harness before issue 11 (.oldharness/kpremote) and through this one
#          (--audit off): medians, spread, wall seconds per row -> cost.md (benchmarks/gpu/cost_report.py)
# redteam  the red team's GPU attacks and both controls (benchmarks/gpu/redteam.sh)
# Upstream baseline files are git-ignored: .gpustage/upstream.tgz holds them (made by `inv baseline --materialize`
# on the client). Everything lands in $OUT/trust.tgz (the device tool brings back at most 8 files).
set -uo pipefail
out=/tmp/kp-trust; mkdir -p "$out"
pack() { tar czf "${OUT:-/tmp}/trust.tgz" -C "$out" . 2>/dev/null; }
trap pack EXIT
[ -f .gpustage/upstream.tgz ] && tar xzf .gpustage/upstream.tgz
source benchmarks/gpu/ssh_host.sh
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; "$py" -c 'import torch, triton;
print("torch", torch.__version__, "triton", triton.__version__)'; echo "ncu: $(command -v ncu)"; } > "$out/machine.txt" 2>&1
fuse=h200_diffusion_fuse_scale_shift__multi_shape
norm=h200_diffusion_norm_infer__multi_shape
rot=h200_diffusion_rotary_embedding__multi_shape
prod() {  # the production row ids of a task folder, comma-separated
  python3 -c 'import sys, tomllib; rows = tomllib.load(open(sys.argv[1] + "/bench/workloads.toml", "rb"))["workload"]
print(",".join(r["id"] for r in rows if r.get("production")))' "$1"
}
timed() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1; local code=$?
  echo "$name: exit $code after $((SECONDS - t0)) s" | tee -a "$out/steps.txt"; }

step_refresh() {
  local task
  for task in ${REFRESH_TASKS:-$fuse $rot $norm}; do
    timed "run-$task" "${REFRESH_S:-200}" python3 -m invoke run --hosts /tmp/hosts.toml --host h200-ssh --task $task \
      --workloads "$(prod kernels/$task)"
    local latest; latest=$(ls -d kernels/$task/results/h200-ssh/*/ 2>/dev/null | tail -1)
    [ -n "$latest" ] && cp "$latest/results.md" "$out/$task.results.md" && cp "$latest/results.json" "$out/$task.results.json"
    [ -n "$latest" ] && cp "$latest/speedup.png" "$out/$task.speedup.png" 2>/dev/null
    pack
  done
}

step_cost() {
  local rows; rows=$(prod .oldharness/kernels/$fuse)
  timed cost-new "${COST_S:-120}" python3 -m kpremote.agent run --task-dir .oldharness/kernels/$fuse \
    --run-dir /tmp/kp-cost/new --device cuda --root /tmp/kp-cost/root --workloads "$rows" --audit off
  (cd .oldharness && timed cost-old "${COST_S:-120}" python3 -m kpremote.agent run --task-dir kernels/$fuse \
    --run-dir /tmp/kp-cost/old --device cuda --root /tmp/kp-cost/root --workloads "$rows")
  python3 benchmarks/gpu/cost_report.py --old /tmp/kp-cost/old --new /tmp/kp-cost/new > "$out/cost.md" 2>&1
  cp /tmp/kp-cost/new/summary/results.json "$out/cost-new.results.json" 2>/dev/null
  cp /tmp/kp-cost/old/summary/results.json "$out/cost-old.results.json" 2>/dev/null
  cat "$out/cost.md"; pack
}

step_redteam() {
  OUT="$out/redteam" WORK=/tmp/kp-redteam timed redteam "${REDTEAM_S:-230}" bash benchmarks/gpu/redteam.sh \
    "${REDTEAM_SET:-control_fast,control_same,side_stream,background_thread,persisting_l2,patch_timer_stats,patch_sync,patch_baseline_sleep,sleep_first_call,graph_replay,empty_graph,geomean_collapse}"
  cat "$out/redteam/redteam.md" 2>/dev/null | tail -25; pack
}

for step in ${@:-refresh cost}; do echo "== $step"; "step_$step"; done
cat "$out/steps.txt"
