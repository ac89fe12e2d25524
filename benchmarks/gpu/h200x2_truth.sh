#!/usr/bin/env bash
# Multi-GPU host truth (issue 16) on a lent two-GPU machine (device kind nvidia-h200-x2, carry [".gpuhost"]),
# through SSH as a user would run kpremote. From the repository root:
#   bash benchmarks/gpu/h200x2_truth.sh
# 1. gpu-status: both GPUs, their UUIDs, idle
# 2. two `inv run`s of different tasks started at the same moment: different GPUs, both pass, neither waited
# 3. a foreign process holding memory and compute on GPU 0: a new run picks GPU 1; gpu-status shows GPU 0 busy with
#    its reason and GPU 1 leased (and not idle in the JSON) while the run lasts
# 4. --gpu <busy GPU's uuid> is refused with the reason; --wait while both GPUs are leased starts as soon as one
#    frees and takes that one
# 5. a foreign process appearing on the other GPU mid-run does not invalidate the run's rows
# Everything lands in $OUT/x2.tgz plus a summary table $OUT/x2.md.
set -uo pipefail
out=/tmp/kpremote-x2; mkdir -p "$out"
trap 'tar czf "${OUT:-/tmp}/x2.tgz" -C "$out" . ; cp "$out/x2.md" "${OUT:-/tmp}/x2.md" 2>/dev/null' EXIT
source benchmarks/gpu/ssh_host.sh
inv() { python3 -m invoke "$@"; }
H=(--hosts /tmp/hosts.toml --host h200-ssh)
fuse=h200_diffusion_fuse_scale_shift__multi_shape
rot=h200_diffusion_rotary_embedding__multi_shape
note() { echo "$*" | tee -a "$out/x2.md"; }
nvidia-smi -L > "$out/machine.txt" 2>&1
uuid() { nvidia-smi --query-gpu=uuid --format=csv,noheader | sed -n "$(( $1 + 1 ))p"; }
hog() {  # hog GPU_INDEX SECONDS: a foreign process holding 8 GiB and computing
  CUDA_VISIBLE_DEVICES=$1 "$py" - "$2" > /dev/null 2>&1 <<'EOP' &
import sys, time, torch
x = torch.empty(8 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a = a @ a; a /= a.norm()
torch.cuda.synchronize()
EOP
  echo $!
}
gpu_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["provenance"]["gpu"]["uuid"])' "$1"; }
latest() { ls -d kernels/"$1"/results/h200-ssh/*/ | tail -1; }

note "# two-GPU host truth ($(date -u +%FT%TZ))"
note
note "## 1. gpu-status, idle"
inv gpu-status "${H[@]}" > "$out/1-idle.txt" 2>&1; inv gpu-status "${H[@]}" --json > "$out/1-idle.json" 2>&1
note '```'; cat "$out/1-idle.txt" >> "$out/x2.md"; note '```'

note "## 2. two runs started at the same moment"
inv run "${H[@]}" --task $fuse --workloads qwen_s4096_c3072_bcast11 > "$out/2-fuse.txt" 2>&1 & a=$!
inv run "${H[@]}" --task $rot --again > "$out/2-rot.txt" 2>&1 & b=$!
wait $a; ea=$?; wait $b; eb=$?
ga=$(gpu_of "$(latest $fuse)/results.json"); gb=$(gpu_of "$(latest $rot)/results.json")
note "- fuse exit $ea on $ga; rotary exit $eb on $gb; different GPUs: $([ "$ga" != "$gb" ] && echo yes || echo NO)"
grep -h -i "wait" "$out/2-fuse.txt" "$out/2-rot.txt" | head -3 | sed 's/^/- waited? /' >> "$out/x2.md"

note "## 3. foreign process on GPU 0, a new run"
h=$(hog 0 60); sleep 10
inv run "${H[@]}" --task $fuse --workloads qwen_s4096_c3072_bcast11 --detach --json > "$out/3-start.json" 2>&1
sleep 3
inv gpu-status "${H[@]}" > "$out/3-status.txt" 2>&1; inv gpu-status "${H[@]}" --json > "$out/3-status.json" 2>&1
note '```'; cat "$out/3-status.txt" >> "$out/x2.md"; note '```'
python3 - "$out/3-status.json" >> "$out/x2.md" <<'EOP'
import json, sys
doc = json.load(open(sys.argv[1]))
for host in doc.get("hosts", []):
    for g in host.get("gpus", []):
        print(f"- JSON: GPU {g['index']} idle={g.get('idle')} lease={'yes' if g.get('lease') else 'no'} reason={g.get('reason')}")
EOP

note "## 4. --gpu on the busy GPU; --wait while both are leased"
inv run "${H[@]}" --task $rot --gpu "$(uuid 0)" > "$out/4-busy-gpu.txt" 2>&1
note "- --gpu GPU 0 (busy): exit $?: $(grep -v '^$' "$out/4-busy-gpu.txt" | tail -1)"
kill $h 2>/dev/null; wait $h 2>/dev/null
inv run "${H[@]}" --task $fuse --again --detach --json > "$out/4-hold-a.json" 2>&1
inv run "${H[@]}" --task $rot --again --detach --json > "$out/4-hold-b.json" 2>&1
t0=$SECONDS
inv run "${H[@]}" --task $rot --workloads "$(python3 -c 'import tomllib;print(tomllib.load(open("kernels/'$rot'/bench/workloads.toml","rb"))["workload"][0]["id"])')" \
  --wait 600 > "$out/4-wait.txt" 2>&1
note "- --wait: exit $? after $((SECONDS - t0)) s on $(gpu_of "$(latest $rot)/results.json")"

note "## 5. foreign process on the other GPU mid-run"
inv run "${H[@]}" --task $fuse --gpu "$(uuid 0)" > "$out/5-run.txt" 2>&1 & r=$!
sleep 15; h=$(hog 1 40); wait $r; e=$?; kill $h 2>/dev/null
python3 - "$(latest $fuse)/results.json" "$e" >> "$out/x2.md" <<'EOP'
import json, sys
res = json.load(open(sys.argv[1]))
invalid = [r["workload"] for r in res["rows"] if r.get("invalid")]
print(f"- run on GPU {res['provenance']['gpu']['uuid']}: exit {sys.argv[2]}, invalid rows: {invalid or 'none'}")
EOP
cat "$out/x2.md"
