#!/usr/bin/env bash
# Two device calls on a lent host of two or four GPUs (issue 27's hardware steps, issue 33's neighbours), through `inv`
# over SSH as a user runs it: makes this GPU machine the SSH host (../shared/gpu-host, benchmarks/gpu/ssh_host.sh),
# then runs benchmarks/gpu/x4_host.py, whose docstring lists the six steps. Each step is time-boxed and independent;
# the whole call is held to X4_BUDGET_S (default 470 s). Steps 1 to 5 are one call, step 6 (neighbours) a second:
# From the repository root on the GPU machine (device tool; carry .gpuhost and .gpustage):
#   bash benchmarks/gpu/x4_host.sh            -> $OUT/summary.md, $OUT/step1.log ... step5.log, $OUT/logs.tgz
#   X4_STEPS=6 bash benchmarks/gpu/x4_host.sh     (the second call: neighbours, alone, N at once, alone again)
#   X4_STEPS=2,3 bash benchmarks/gpu/x4_host.sh   (only those steps)
# Without a GPU (a dry run: an sshd on loopback, the NVML fixture's GPUs, runs on the CPU):
#   X4_DRY=1 [X4_DRY_GPUS=2] [X4_DRY_MODEL=h200|h100] bash benchmarks/gpu/x4_host.sh
set -uo pipefail
out=${OUT:-/tmp/kp-x4-out}; mkdir -p "$out"
if [ "${X4_DRY:-0}" = 1 ]; then
  py=${PYTHON:-$(ls .venv/bin/python 2>/dev/null || command -v python3)}
  exec "$py" benchmarks/gpu/x4_host.py --dry --gpus "${X4_DRY_GPUS:-2}" --model "${X4_DRY_MODEL:-h200}" --out "$out" "$@"
fi
[ -f .gpustage/upstream.tgz ] && tar xzf .gpustage/upstream.tgz
out_dir=$out; out=/tmp/kp-x4-sshd; mkdir -p "$out"   # ssh_host.sh's sshd.txt stays out of $OUT (8 files at most)
# If the SSH host does not start (ssh_host.sh exits), summary.md says so with sshd's own words.
trap '{ echo "# x4_host: the SSH host did not start"; echo; echo "\`\`\`"; cat "$out/sshd.txt"; echo "\`\`\`"; } \
  > "$out_dir/summary.md" 2>&1' EXIT
source benchmarks/gpu/ssh_host.sh
trap - EXIT
exec python3 benchmarks/gpu/x4_host.py --out "$out_dir" "$@"
