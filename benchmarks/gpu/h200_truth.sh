#!/usr/bin/env bash
# GPU truth on the lent H200 machine, through SSH, as a user would run kpremote.
# Run from the repository root on the GPU machine (device tool, carry [".gpuhost"]):
#   bash benchmarks/gpu/h200_truth.sh "TASK[,TASK...]" [WORKLOADS]
# Everything lands in $OUT/truth.tgz (the device tool brings back at most 8 files).
set -uo pipefail
out=/tmp/kpremote-truth; mkdir -p "$out"
trap 'tar czf "${OUT:-/tmp}/truth.tgz" -C "$out" . ; ls -la "$out"' EXIT
tasks=${1:-h200_diffusion_fuse_scale_shift__multi_shape}
workloads=${2:-}
source benchmarks/gpu/ssh_host.sh
inv() { python3 -m invoke "$@"; }
{ nvidia-smi; "$py" -c 'import torch, triton; print(torch.__version__, triton.__version__)'; } > "$out/machine.txt" 2>&1

# 1. gpu-status: idle, then busy while another process holds 8 GiB and computes
inv gpu-status --hosts /tmp/hosts.toml --host h200-ssh > "$out/gpu-status-idle.txt" 2>&1
"$py" - > /dev/null 2>&1 <<'EOP' &
import torch, time
x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + 25
while time.time() < end:
    a = a @ a; a /= a.norm()
torch.cuda.synchronize()
EOP
hog=$!
sleep 12
inv gpu-status --hosts /tmp/hosts.toml --host h200-ssh > "$out/gpu-status-busy.txt" 2>&1
inv gpu-status --hosts /tmp/hosts.toml --host h200-ssh --json > "$out/gpu-status-busy.json" 2>&1
wait $hog

# 2. inv run through SSH, then fetch-results (the run fetches its summary itself; fetch again shows idempotence)
for task in ${tasks//,/ }; do
  args=(run --hosts /tmp/hosts.toml --host h200-ssh --task "$task" --again)  # --again: a repeat measures again
  [ -n "$workloads" ] && args+=(--workloads "$workloads")
  t0=$SECONDS
  python3 -m invoke "${args[@]}" > "$out/$task.run.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s" >> "$out/$task.run.txt"
  inv fetch-results --hosts /tmp/hosts.toml --host h200-ssh --task "$task" >> "$out/$task.run.txt" 2>&1
  latest=$(ls -d kernels/"$task"/results/h200-ssh/*/ | tail -1)
  cp "$latest/results.md" "$out/$task.results.md" 2>/dev/null
  cp "$latest/results.json" "$out/$task.results.json" 2>/dev/null
done
