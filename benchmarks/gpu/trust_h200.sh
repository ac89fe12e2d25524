#!/usr/bin/env bash
# The trusted harness on the lent H200 (issue 11's cost figures and the refreshed task results), as a user runs it.
# From the repository root on the GPU machine (device tool; carry .gpuhost, .oldharness and .gpustage):
#   bash benchmarks/gpu/trust_h200.sh [STEP...]        (default: refresh cost)
# refresh  `inv run` over SSH of each shipped task's production rows (Nsight Compute audit on, the default), then
#          the fetched results.md/json
# cost     the same production rows of the fuse_scale_shift task (the pre-trust task folder in .oldharness, so the
#          kernels are identical) through the harness before issue 11 (.oldharness/kpremote) and through this one
#          (--audit off): medians, spread, wall seconds per row -> cost.md (benchmarks/gpu/cost_report.py);
#          COST_OLD=DIR compares against another harness tree instead (DIR/kpremote, e.g. an earlier commit's:
#          `mkdir .h23 && git archive 86b04c7 kpremote | tar -x -C .h23`, .h23 in .git/info/exclude, carried)
# redteam  the red team: every attack (REDTEAM_SET=all, the default) or a list, through benchmarks/gpu/redteam.sh
# probe    the L2 flush probe (deviceprobe.flush_probe) five times
# tvmffi   install the carried .whl/apache_tvm_ffi-*.whl (for the tvm-ffi task; REFRESH_TASKS names it)
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

step_cost() {  # COST_RUNS runs of each harness, alternating new and old, so drift lands on both
  local rows; rows=$(prod .oldharness/kernels/$fuse)
  local n olds="" news="" task=$PWD/.oldharness/kernels/$fuse
  local old=${COST_OLD:-.oldharness}  # the harness to compare against: a tree holding kpremote/
  local old_audit=""; [ "$old" != .oldharness ] && old_audit="--audit off"  # the pre-trust harness has no audit
  for n in $(seq 1 "${COST_RUNS:-2}"); do
    timed cost-new-$n "${COST_S:-120}" python3 -m kpremote.agent run --task-dir "$task" \
      --run-dir /tmp/kp-cost/new$n --device cuda --root /tmp/kp-cost/root --workloads "$rows" --audit off
    (cd "$old" && timed cost-old-$n "${COST_S:-120}" python3 -m kpremote.agent run --task-dir "$task" \
      --run-dir /tmp/kp-cost/old$n --device cuda --root /tmp/kp-cost/root --workloads "$rows" $old_audit)
    news="$news${news:+,}/tmp/kp-cost/new$n"; olds="$olds${olds:+,}/tmp/kp-cost/old$n"
    cp /tmp/kp-cost/new$n/summary/results.json "$out/cost-new$n.results.json" 2>/dev/null
    cp /tmp/kp-cost/old$n/summary/results.json "$out/cost-old$n.results.json" 2>/dev/null
    gzip -c /tmp/kp-cost/new$n/raw/samples.jsonl > "$out/cost-new$n.samples.jsonl.gz" 2>/dev/null
    gzip -c /tmp/kp-cost/old$n/raw/samples.jsonl > "$out/cost-old$n.samples.jsonl.gz" 2>/dev/null
  done
  python3 benchmarks/gpu/cost_report.py --old "$olds" --new "$news" > "$out/cost.md" 2>&1
  cat "$out/cost.md"; pack
}

step_tvmffi() {  # the tvm-ffi wheel carried in .whl/ (a GPU host brings its own packages; this one has no network)
  timed tvmffi-install 120 python3 -m pip install --no-deps --no-index .whl/apache_tvm_ffi-*.whl
  python3 -c 'import tvm_ffi; print("tvm_ffi", tvm_ffi.__version__)' | tee -a "$out/machine.txt"
}

step_probe() {  # the L2 flush probe as the prepare worker takes it, five times
  timed probe 60 python3 -c 'import json
from kpremote.agent.harness import deviceprobe
for _ in range(5): print(json.dumps(deviceprobe.flush_probe()))'
  cat "$out/probe.txt"
}

step_redteam() {
  OUT="$out/redteam" WORK=/tmp/kp-redteam timed redteam "${REDTEAM_S:-540}" bash benchmarks/gpu/redteam.sh \
    "${REDTEAM_SET:-all}"
  cat "$out/redteam/redteam.md" 2>/dev/null | tail -25; pack
}

for step in ${@:-refresh cost}; do echo "== $step"; "step_$step"; done
cat "$out/steps.txt"
