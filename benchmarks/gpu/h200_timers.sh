#!/usr/bin/env bash
# Issue 3's GPU figures in one session on the lent H200 (device tool, carry [".gpuhost"]):
#   bash benchmarks/gpu/h200_timers.sh
# 1. the same task run 5 times through `inv run` over SSH (production rows): spread of each workload's median;
# 2. triton.testing.do_bench on the same kernels, 5 repeats, same session;
# 3. Nsight Compute's gpu__time_duration (cold caches: ncu's default --cache-control all; --clock-control none);
# 4. a candidate that hides its work on a side stream, through the agent;
# 5. the CUDA task (norm_infer) end to end through `inv run`.
# Everything lands in $OUT/timers.tgz.
set -uo pipefail
out=/tmp/kp-timers; mkdir -p "$out"
trap 'tar czf "${OUT:-/tmp}/timers.tgz" -C "$out" .' EXIT
source benchmarks/gpu/ssh_host.sh
task=h200_diffusion_fuse_scale_shift__multi_shape
wl=qwen_s19_c3072_bcast11,qwen_s47_c3072_bcast11,qwen_s4096_c3072_bcast11,wan_t2v_s37800_c5120_bcast11_fp32mod,qwen_edit_gated_s8424_c3072
runs=()
for i in 1 2 3 4 5; do
  python3 -m invoke run --hosts /tmp/hosts.toml --host h200-ssh --task $task --workloads $wl --json \
    > "$out/stability-$i.json" 2> "$out/stability-$i.err"
  dir=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0]['summary_dir'])" "$out/stability-$i.json")
  cp "$dir/results.json" "$out/stability-$i.results.json" && runs+=("$out/stability-$i.results.json")
done
python3 benchmarks/gpu/compare_timers.py dobench --task-dir kernels/$task --workloads $wl --repeats 5 \
  --out "$out/dobench.json" > "$out/dobench.log" 2>&1
ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
  python3 benchmarks/gpu/compare_timers.py ncu --task-dir kernels/$task --workloads $wl --calls 5 \
  > "$out/ncu-order.json" 2> "$out/ncu.err"
python3 benchmarks/gpu/compare_timers.py report --harness "$(IFS=,; echo "${runs[*]}")" --dobench "$out/dobench.json" \
  --ncu-csv "$out/ncu.csv" --order "$out/ncu-order.json" --calls 5 > "$out/timers.md" 2> "$out/report.err"
cat "$out/timers.md"

# 4. side-stream cheat: the tiny task with a candidate that runs on a stream the current one never joins
cheat=/tmp/cheat_task; rm -rf $cheat; cp -r tests/fixtures/tasks/tiny_rmsnorm $cheat
cp $cheat/solution/kernel.py $cheat/solution/honest.py
cp tests/fixtures/tasks/adversarial/side_stream.py $cheat/solution/kernel.py
cp tests/fixtures/tasks/adversarial/side_stream.toml $cheat/bench/workloads.toml
python3 -m kpremote.agent run --task-dir $cheat --run-dir /tmp/cheat_run --device cuda --root /tmp/cheat_root \
  > "$out/side-stream.log" 2>&1
cp /tmp/cheat_run/summary/results.md "$out/side-stream.results.md"

# 5. the CUDA task end to end
python3 -m invoke run --hosts /tmp/hosts.toml --host h200-ssh --task h200_diffusion_norm_infer__multi_shape \
  > "$out/norm_infer.run.txt" 2>&1
echo "exit $?" >> "$out/norm_infer.run.txt"
latest=$(ls -d kernels/h200_diffusion_norm_infer__multi_shape/results/h200-ssh/*/ | tail -1)
cp "$latest/results.md" "$out/norm_infer.results.md"; cp "$latest/results.json" "$out/norm_infer.results.json"
tail -3 "$out/norm_infer.run.txt"
