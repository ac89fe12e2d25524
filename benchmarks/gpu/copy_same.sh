#!/usr/bin/env bash
# How far apart two processes read the very same kernel (issue 11: a copy of the baseline must come out SAME).
# From the repository root on the GPU machine (device tool; carry .oldharness):
#   RUNS=3 bash benchmarks/gpu/copy_same.sh
# Each run times, through this harness (--audit off), tasks whose candidate IS the baseline (solution/kernel.py
# replaced by baseline/kernel.py): the five production rows of the fuse_scale_shift task (its pre-trust folder in
# .oldharness, whose baseline is a plain Triton file) and every row of the test fixture tiny_rmsnorm. Prints, per
# row and run, both medians, how far apart they are (ns and %), the interval and the verdict; everything lands in
# $OUT/copy.tgz.
set -uo pipefail
work=/tmp/kp-copy; rm -rf "$work"; mkdir -p "$work"
trap 'tar czf "${OUT:-/tmp}/copy.tgz" -C "$work" --exclude="*/root" --exclude="*/$fuse" --exclude="*/tiny_rmsnorm" . 2>/dev/null' EXIT
fuse=h200_diffusion_fuse_scale_shift__multi_shape
rows=$(python3 -c 'import sys, tomllib; rows = tomllib.load(open(sys.argv[1], "rb"))["workload"]
print(",".join(r["id"] for r in rows if r.get("production")))' .oldharness/kernels/$fuse/bench/workloads.toml)
for n in $(seq 1 "${RUNS:-3}"); do
  for name in fuse fixture; do
    dir=$work/$name$n; mkdir -p "$dir"
    if [ $name = fuse ]; then task=$dir/$fuse; cp -r .oldharness/kernels/$fuse "$task"; args=(--workloads "$rows")
    else task=$dir/tiny_rmsnorm; cp -r tests/fixtures/tasks/tiny_rmsnorm "$task"; args=(); fi
    cp "$task/baseline/kernel.py" "$task/solution/kernel.py"
    t0=$SECONDS
    timeout 300 python3 -m kpremote.agent run --task-dir "$task" --run-dir "$dir/run" --device cuda \
      --root "$dir/root" --audit off "${args[@]}" > "$dir/out.txt" 2>&1
    echo "$name$n: exit $? after $((SECONDS - t0)) s"
    cp "$dir/run/summary/results.json" "$dir/results.json" 2>/dev/null
  done
done
python3 - "$work" <<'PY' | tee "$work/copy.md"
import json, sys
from pathlib import Path
print("| run | row | baseline median us | candidate median us | apart ns | speedup [interval] | noise | verdict |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(Path(sys.argv[1]).glob("*/results.json")):
    for row in json.loads(path.read_text())["rows"]:
        t, v = row.get("timing") or {}, row.get("verdict") or {}
        if not t:
            print(f"| {path.parent.name} | {row['workload']} | {row['status']} | | | | | |"); continue
        b, c = t["baseline"]["median"], t["candidate"]["median"]
        print(f"| {path.parent.name} | {row['workload']} | {b:.3f} | {c:.3f} | {(b - c) * 1000:+.0f} | "
              f"{v['speedup']:.3f} [{v['low']:.3f}, {v['high']:.3f}] | {v['noise'] * 100:.1f} % | {v['verdict']} |")
PY
