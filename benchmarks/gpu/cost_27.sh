#!/usr/bin/env bash
# Harness 2.7 against this tree's harness, side by side on one GPU in one call (issue 25 item 4: "wall time per row
# within 1.3x of harness 2.7's, measured side by side"). The runs alternate: 2.7 (the agent of commit 6ca1e8d and its
# own copy of the task) then this tree's, COST_RUNS (3) times each, every run `python -m <runner>` with fresh judge
# and side processes, --audit off, fuse_scale_shift's two 4-5 us production rows (COST_ROWS) on an H200; on another
# GPU (the task's arch gate refuses it) tests/fixtures/tasks/tiny_rmsnorm's two ~3 us production rows (COST_TASK:
# a task folder that both commits hold, arch "any"). Each run's wall time
# from the shell, its rows' verdicts and speedups from its results.json; cost.md (the table, the means and their
# ratio) and cost_27.tgz (the runs' results.json and logs) land in $OUT.
#   here: bash benchmarks/gpu/cost_27.sh pack    (.gpustage/h27: git archive of 6ca1e8d's kpremote/ and the task,
#                                                  with this checkout's baseline/upstream; carry that path)
#   GPU:  bash benchmarks/gpu/cost_27.sh runs
set -uo pipefail
[ -f benchmarks/gpu/cost_27.sh ] || { echo "cost_27.sh: run it from the repository root"; exit 2; }
old_commit=${COST_OLD_COMMIT:-6ca1e8d}  # main when issue 25 measured harness 2.7; COST_OLD_COMMIT=d3bce19: harness 2.16 (issue 44: cost against the harness before it)
old=$PWD/.gpustage/h27
fuse=kernels/h200_diffusion_fuse_scale_shift__multi_shape
if [ -z "${COST_TASK:-}" ] && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q H200; then
  COST_TASK=$fuse COST_ROWS=${COST_ROWS:-qwen_s19_c3072_bcast11,qwen_s47_c3072_bcast11}
fi
task=${COST_TASK:-tests/fixtures/tasks/tiny_rmsnorm}
rows=${COST_ROWS:-prod_r4_c64,prod_r3_c100}

pack() {  # both task folders: the GPU decides which one runs
  rm -rf "$old"; mkdir -p "$old"
  git archive "$old_commit" kpremote "$fuse" tests/fixtures/tasks/tiny_rmsnorm | tar -x -C "$old"
  [ -d "$fuse/baseline/upstream" ] || { echo "pack: inv baseline --materialize --task ${fuse#kernels/} first"; exit 2; }
  cp -r "$fuse/baseline/upstream" "$old/$fuse/baseline/"
  du -sh "$old"
}

runs() {
  local out=${OUT:-/tmp/kp-cost-out} work=/tmp/kp-cost
  echo "task $task, rows $rows, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  [ -d "$old/kpremote" ] || { echo "runs: no $old: carry .gpustage/h27 (made by 'pack' here)"; exit 2; }
  rm -rf "$work"; mkdir -p "$out" "$work/new" "$work/runs"
  cp -r "$task" "$work/new/"
  printf 'run\tharness\texit\twall_s\n' > "$work/walls.tsv"
  for i in $(seq "${COST_RUNS:-3}"); do
    for which in old new; do
      local t0 tree module task_dir code
      if [ "$which" = old ]; then tree=$old task_dir=$old/$task module=kpremote.agent.run.runner  # 2.16's place
        [ -f "$old/kpremote/agent/run/runner.py" ] || module=kpremote.agent.runner  # 2.7's, before agent/ had folders
      else tree=$PWD module=kpremote.agent.run.runner task_dir=$work/new/$(basename "$task"); fi
      t0=$(date +%s%N)
      (cd "$tree" && PYTHONPATH="$tree" timeout 120 python3 -m "$module" --task-dir "$task_dir" \
        --run-dir "$work/runs/$which-$i" --device cuda --root "$work/root-$which" --workloads "$rows" --audit off \
        > "$work/runs/$which-$i.log" 2>&1)
      code=$?
      printf '%s\t%s\t%s\t%s\n' "$which-$i" "$which" "$code" "$(( ($(date +%s%N) - t0) / 10000000 ))e-2" >> "$work/walls.tsv"
      tail -1 "$work/walls.tsv"
    done
  done
  python3 - "$work" > "$out/cost.md" <<'EOP'
import csv, json, statistics, sys
from pathlib import Path
work = Path(sys.argv[1])
walls = list(csv.DictReader(open(work / "walls.tsv"), delimiter="\t"))
print("| run | harness | exit | wall s | rows: verdict speedup |\n|---|---|---:|---:|---|")
means = {}
for w in walls:
    results = work / "runs" / w["run"] / "summary" / "results.json"
    data = json.loads(results.read_text()) if results.is_file() else {}
    version = (data.get("provenance") or {}).get("harness", {}).get("version", "?")
    rows = "; ".join(f"{r['workload']} {(r.get('verdict') or {}).get('verdict', r.get('status'))} "
                     f"{(r.get('speedup') or 0):.3f}x" for r in data.get("rows", []))
    print(f"| {w['run']} | {version} | {w['exit']} | {float(w['wall_s']):.1f} | {rows} |")
    means.setdefault(w["harness"], []).append(float(w["wall_s"]))
old, new = statistics.mean(means["old"]), statistics.mean(means["new"])
print(f"\nmean wall a run: 2.7 (old) {old:.1f} s over {len(means['old'])}, this tree {new:.1f} s over "
      f"{len(means['new'])}: **{new / old:.2f}x**")
EOP
  cat "$out/cost.md"
  tar czf "$out/cost_27.tgz" -C "$work" --exclude "*/raw/scratch" --exclude "*/raw/build" walls.tsv runs 2>/dev/null
}

case "${1:-}" in
  pack) pack ;;
  runs) runs ;;
  *) echo "usage: bash benchmarks/gpu/cost_27.sh pack | runs"; exit 2 ;;
esac
