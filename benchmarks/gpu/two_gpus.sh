#!/usr/bin/env bash
# One call on a lent host of two or four GPUs (issues 27 and 33), through SSH as a user would where it matters:
#   1. `inv gpu-status -u` at 80 columns: every GPU with its UUID;
#   2. neighbours (benchmarks/gpu/neighbours.sh): the red team's control_fast task (arch "any") on its tiny and mid
#      rows alone on GPU 0, then one run per GPU at once, each leasing its own, audit on;
#   3. the arch gate on real hardware: `inv run` of the H200 fuse_scale_shift task's production rows over SSH:
#      refused with the reason on an H100, a run (audit on) on an H200.
# From the repository root on the GPU machine (device tool; carry .gpuhost and .gpustage):
#   bash benchmarks/gpu/two_gpus.sh          -> $OUT/two_gpus.md, $OUT/neighbours.md, $OUT/fuse.results.md/json
set -uo pipefail
out=${OUT:-/tmp/kp-two}; mkdir -p "$out"
[ -f .gpustage/upstream.tgz ] && tar xzf .gpustage/upstream.tgz
source benchmarks/gpu/ssh_host.sh
fuse=h200_diffusion_fuse_scale_shift__multi_shape
report=$out/two_gpus.md
{ echo '# Two GPUs, one host'; echo; echo '```'; nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader
  echo '```'; } > "$report"
echo '## inv gpu-status -u (80 columns)' >> "$report"
{ echo '```'; COLUMNS=80 timeout 60 python3 -m invoke gpu-status --hosts /tmp/hosts.toml -u 2>&1; echo "exit $?"; echo '```'; } >> "$report"
OUT=$out timeout "${NEIGHBOURS_S:-240}" bash benchmarks/gpu/neighbours.sh > /dev/null 2>&1
echo "neighbours: exit $?" >> "$out/steps.txt"
echo '## inv run of the H200 task (the arch gate on this hardware)' >> "$report"
rows=$(python3 -c 'import sys, tomllib; rows = tomllib.load(open(sys.argv[1] + "/bench/workloads.toml", "rb"))["workload"]
print(",".join(r["id"] for r in rows if r.get("production")))' "kernels/$fuse")
{ echo '```'; COLUMNS=120 timeout "${FUSE_S:-200}" python3 -m invoke run --hosts /tmp/hosts.toml --host h200-ssh \
    --task $fuse --workloads "$rows" 2>&1 | tail -40; echo "exit ${PIPESTATUS[0]}"; echo '```'; } >> "$report"
latest=$(ls -d kernels/$fuse/results/h200-ssh/*/ 2>/dev/null | tail -1)
[ -n "$latest" ] && cp "$latest/results.md" "$out/fuse.results.md" && cp "$latest/results.json" "$out/fuse.results.json"
cat "$report" "$out/neighbours.md" 2>/dev/null
