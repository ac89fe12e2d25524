#!/usr/bin/env bash
# Neighbours (issues 27, 33) on a lent host of two or more GPUs: one task's small rows alone on GPU 0, then one run of
# it per GPU at once, each leasing an idle GPU itself (which one it got is in its results), then (NEIGHBOURS_AGAIN=1)
# alone again; each through `python -m kpremote.agent.run.runner` with the Nsight Compute audit on, so the neighbouring
# runs' load (their audits included) falls on each run's timed windows as on a shared box.
# From the repository root on the GPU machine (device tool):
#   TASK_DIR=kernels/<task> WORKLOADS=a,b bash benchmarks/gpu/neighbours.sh
# (default: the red team's control_fast task, whose arch is "any", on its tiny and mid rows). Writes $OUT/neighbours.md:
# per run and row the verdict, both medians, the audit's numbers and whether it agreed; then per row and side the
# median alone against together. The GPUs are kpremote's NVML reading (the NVML fixture where KPREMOTE_NVML_FIXTURE
# names one: NEIGHBOURS_DEVICE=cpu then tries the script on a machine without a GPU).
set -uo pipefail
out=${OUT:-/tmp/kp-neighbours}; mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work=/tmp/kp-neighbours; rm -rf "$work"; mkdir -p "$work"
task=${TASK_DIR:-}
if [ -z "$task" ]; then
  python3 -c 'import sys, pathlib; sys.path.insert(0, "tests/fixtures/redteam"); import redteam_kit as k
k.assemble(next(a for a in k.load_attacks() if a.id == "control_fast"), pathlib.Path(sys.argv[1]))' "$work/kernels"
  task=$work/kernels/redteam_control_fast
fi
rows=${WORKLOADS:-tiny,mid}
python3 -c 'from kpremote.agent import nvml; s = nvml.snapshot()
print(s.source, s.driver, s.error or ""); [print(g.index, g.name, g.uuid) for g in s.gpus]' > "$out/machine.txt"
gpus=$(($(wc -l < "$out/machine.txt") - 1))
run() {  # run NAME [GPU_INDEX]: without an index the run leases an idle GPU as `inv run` does
  python3 -m kpremote.agent.run.runner --task-dir "$task" --run-dir "$work/runs/$1" --device "${NEIGHBOURS_DEVICE:-cuda}" ${2:+--gpu "$2"} \
    --root "$work/root" --workloads "$rows" --audit on > "$out/$1.log" 2>&1
  echo "$1 exit $?" >> "$out/steps.txt"
}
run alone-1 0
for i in $(seq "$gpus"); do run "together-$i" & sleep 0.2; done; wait
[ "${NEIGHBOURS_AGAIN:-0}" = 1 ] && run alone-2 0
python3 - "$work/runs" > "$out/neighbours.md" <<'PY'
import json, sys, pathlib
print("| run | GPU | row | status | verdict | speedup | baseline us | candidate us | audit (harness / ncu us, side) | invalid |")
print("|---|---|---|---|---|---:|---:|---:|---|---|")
medians = {}  # (row, "alone" or "together") -> [(side, median us)]
for folder in sorted(pathlib.Path(sys.argv[1]).iterdir(), key=lambda p: (not p.name.startswith("alone-1"), p.name)):
    run, path = folder.name, folder / "summary" / "results.json"
    if not path.exists():
        print(f"| {run} | | - | no results | | | | | | |"); continue
    results = json.loads(path.read_text())
    gpu = (results["provenance"].get("gpu") or {})
    for row in results["rows"]:
        t = row.get("timing") or {}
        audit = row.get("audit") or {}
        a = (f"{'agree' if audit.get('agree') else 'DISAGREE'} {audit.get('harness_us', 0):.2f} / "
             f"{audit.get('ncu_us') or 0:.2f} {audit.get('side')}") if isinstance(audit, dict) and audit else "-"
        print(f"| {run} | {gpu.get('index')} {str(gpu.get('uuid'))[:12]} | {row['workload']} | {row['status']} | {(row.get('verdict') or {}).get('verdict')} | "
              f"{row.get('speedup') or 0:.3f} | {(t.get('baseline') or {}).get('median', 0):.2f} | "
              f"{(t.get('candidate') or {}).get('median', 0):.2f} | {a} | {row.get('invalid') or ''} |")
        medians.setdefault((row["workload"], run.split("-")[0]), []).extend(
            [(side, (t.get(side) or {}).get("median")) for side in ("baseline", "candidate")])
print()
print("| row | side | alone us (each run) | together us (min-max) | together against alone |")
print("|---|---|---:|---:|---:|")
for row in dict.fromkeys(w for w, _ in medians):
    for side in ("baseline", "candidate"):
        alone, together = ([m for s, m in medians.get((row, kind), []) if s == side and m] for kind in ("alone", "together"))
        if not alone or not together:
            print(f"| {row} | {side} | - | - | - |"); continue
        change = 100 * (sum(together) / len(together) / (sum(alone) / len(alone)) - 1)
        print(f"| {row} | {side} | {' / '.join(f'{m:.2f}' for m in alone)} | {min(together):.2f}-{max(together):.2f} | {change:+.1f} % |")
PY
cat "$out/steps.txt" "$out/neighbours.md"
