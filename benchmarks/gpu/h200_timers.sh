#!/usr/bin/env bash
# kpremote's GPU figures on the lent H200 (device tool, carry [".gpuhost"]), one session, as a user would run it:
#   bash benchmarks/gpu/h200_timers.sh [STEP...]      (default: cheat stability norm profile fuse)
# cheat      a candidate that hides its work on a side stream, through the agent
# stability  the same task run $RUNS times (default 5) through `inv run` over SSH (production rows), then
#            triton.testing.do_bench on the same kernels and Nsight Compute's gpu__time_duration (cold caches:
#            ncu's default --cache-control all; --clock-control none), compared by compare_timers.py
# norm       the CUDA task (norm_infer) end to end through `inv run`
# profile    `inv profile` of one fuse_scale_shift workload, both sides, then one raw file on request
# fuse       the fuse_scale_shift task end to end through `inv run` (all rows)
# Results are packed into $OUT/timers.tgz after every step (the device tool returns at most 8 files).
set -uo pipefail
out=/tmp/kp-timers; mkdir -p "$out"
pack() { tar czf "${OUT:-/tmp}/timers.tgz" -C "$out" .; }
source benchmarks/gpu/ssh_host.sh
fuse=h200_diffusion_fuse_scale_shift__multi_shape
prod=qwen_s19_c3072_bcast11,qwen_s47_c3072_bcast11,qwen_s4096_c3072_bcast11,wan_t2v_s37800_c5120_bcast11_fp32mod,qwen_edit_gated_s8424_c3072

inv_run() {  # inv_run NAME TASK [inv run args...]: the run's output, its fetched results.md/json, into $out
  local name=$1 task=$2; shift 2
  python3 -m invoke run --hosts /tmp/hosts.toml --host h200-ssh --task "$task" --again "$@" > "$out/$name.run.txt" 2>&1
  echo "exit $?" >> "$out/$name.run.txt"
  local latest; latest=$(ls -d kernels/"$task"/results/h200-ssh/*/ | tail -1)
  cp "$latest/results.md" "$out/$name.results.md"; cp "$latest/results.json" "$out/$name.results.json"
  tail -2 "$out/$name.run.txt"
}

step_cheat() {
  local cheat=/tmp/cheat/tiny_rmsnorm; rm -rf /tmp/cheat; mkdir -p /tmp/cheat
  cp -r tests/fixtures/tasks/tiny_rmsnorm $cheat
  cp $cheat/solution/kernel.py $cheat/solution/honest.py
  cp tests/fixtures/tasks/adversarial/side_stream.py $cheat/solution/kernel.py
  cp tests/fixtures/tasks/adversarial/side_stream.toml $cheat/bench/workloads.toml
  python3 -m kpremote.agent run --task-dir $cheat --run-dir /tmp/cheat_run --device cuda --root /tmp/cheat_root \
    > "$out/side-stream.log" 2>&1
  cp /tmp/cheat_run/summary/results.md "$out/side-stream.results.md"
}

step_stability() {
  local runs=() i
  for i in $(seq 1 "${RUNS:-5}"); do
    inv_run "stability-$i" $fuse --workloads $prod && runs+=("$out/stability-$i.results.json")
  done
  python3 benchmarks/gpu/compare_timers.py dobench --task-dir kernels/$fuse --workloads $prod --repeats 5 \
    --out "$out/dobench.json" > "$out/dobench.log" 2>&1
  ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
    python3 benchmarks/gpu/compare_timers.py ncu --task-dir kernels/$fuse --workloads $prod --calls 5 \
    > "$out/ncu-order.json" 2> "$out/ncu.err"
  python3 benchmarks/gpu/compare_timers.py report --harness "$(IFS=,; echo "${runs[*]}")" --dobench "$out/dobench.json" \
    --ncu-csv "$out/ncu.csv" --order "$out/ncu-order.json" --calls 5 > "$out/timers.md" 2> "$out/report.err"
  cat "$out/timers.md"
}

step_norm() { inv_run norm_infer h200_diffusion_norm_infer__multi_shape; }

step_profile() {
  local wl=qwen_s4096_c3072_bcast11
  python3 -m invoke profile --hosts /tmp/hosts.toml --host h200-ssh --task $fuse --workload $wl --side both \
    --set full > "$out/profile.txt" 2>&1
  echo "exit $?" >> "$out/profile.txt"
  local latest; latest=$(ls -d kernels/$fuse/results/h200-ssh/*/ | tail -1)
  cp "$latest/profile.md" "$latest/profile.csv" "$out/" 2>/dev/null
  python3 -m invoke fetch-results --hosts /tmp/hosts.toml --host h200-ssh --task $fuse \
    --raw-file ncu/candidate-$wl.ncu-rep >> "$out/profile.txt" 2>&1
  tail -3 "$out/profile.txt"
}

step_fuse() { inv_run fuse $fuse; }

for step in "${@:-cheat stability norm profile fuse}"; do
  for s in $step; do echo "== $s"; "step_$s"; pack; done
done
