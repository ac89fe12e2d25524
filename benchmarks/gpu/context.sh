#!/usr/bin/env bash
# Rows in their context (issue 45, harness 2.18) on a lent GPU: the tasks' production rows that name a context, each
# timed cold, warm and in its context (docs/task-contract.md, "In-context rows"), what that costs, and the A/A
# false-verdict rate in context on the dial. Everything runs through `python -m kpremote.agent.run.runner --device
# cuda` on that machine (no SSH). Run from the repository root:
#   bash benchmarks/gpu/context.sh STEP...          e.g.  tasks fuse,norm_infer aa
# Steps (in the order given; each time-boxed so the call ends inside CONTEXT_BUDGET_S, default 540 s):
#   tasks LIST   each task of LIST (fuse, norm_infer, cutedsl, group_norm_silu, norm_tanh, rotary, qknorm_rope, or
#                all: comma-separated) on its production rows that name a context, the audit on (CONTEXT_AUDIT=off:
#                without), then (CONTEXT_COST=1, the default) the same rows of a copy whose rows name no context, the
#                audit off in both, for the cost of the warm and context regimes: runs tasks/<task>/with-<id> and
#                without-<id>. A task whose estimate does not fit what is left of the call is skipped and says so
#   aa [N]       N runs (default CONTEXT_AA_RUNS, 3) of the dial's A/A rows in context
#                (benchmarks/gpu/dial/bench/workloads.h200-context-aa.toml: 12 rows, launch-bound, ~5 us, ~16 us, the
#                baseline against itself, each timed cold, warm and in context), the audit off: runs aa/<id>. Runs
#                that do not fit the call's budget are not started; 9 runs make 108 row-runs a regime.
#                CONTEXT_AA_FILE=h200-context-aa-s15: the ~18 us s15 row twelve times instead (the warm regime's
#                worst case under 2.19), workloads.<file>.toml of the dial's bench/
# The upstream files of the tasks are git-ignored: carry each task's baseline/upstream, e.g.
#   carry ["kernels/h200_diffusion_fuse_scale_shift__multi_shape/baseline/upstream",
#          "kernels/h200_diffusion_norm_infer__multi_shape/baseline/upstream"]
# (here first, if missing: inv baseline --task <task> --materialize). cutedsl needs nvidia-cutlass-dsl and
# qknorm_rope apache-tvm-ffi on the GPU machine: remeasure.sh's `stage install` (its wheel carries) on the same warm
# machine first (this script then reads KP_SITE's packages, new_tasks.sh env), then `tasks cutedsl,qknorm_rope`;
# without them the task is skipped and says so.
# The tasks are H200 tasks (arch gate): on an H100 each copy's task.toml is marked h100, so its runs say TASK EDITED
# (a harness measurement on the tasks' rows, never a task's result). The copies carry no sync stamp: TASK UNPINNED.
# Each call leaves in $OUT: summary.md (the steps, then benchmarks/gpu/context_report.py's tables over this call's
# runs), machine.txt, and context-<UTC time>.tgz (this call's runs without raw/scratch, raw/build, .ncu-rep files,
# the task copies; the logs). Tables over several calls, here: python3 benchmarks/gpu/context_report.py A.tgz B.tgz
# Environment: OUT (default /tmp/kp-context-out); CONTEXT_WORK (/tmp/kp-context); CONTEXT_BUDGET_S (540);
# CONTEXT_AUDIT (on); CONTEXT_COST (1); CONTEXT_AA_RUNS (3); CONTEXT_AA_FILE (h200-context-aa); CONTEXT_DRY=1
# (this machine without a GPU: --device cpu, each task's smoke rows with a context, the A/A file's launch-bound rows,
# no GPU check); PYTHON.
set -uo pipefail
[ -f benchmarks/gpu/context.sh ] && [ -d kernels ] || { echo "context.sh: run it from the repository root"; exit 2; }
out=${OUT:-/tmp/kp-context-out}
work=${CONTEXT_WORK:-/tmp/kp-context}
budget=${CONTEXT_BUDGET_S:-540}
py=${PYTHON:-python3}
dry=${CONTEXT_DRY:-0}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stamp=$(date -u +%Y%m%d-%H%M%S)
ORDER=(fuse norm_infer cutedsl group_norm_silu norm_tanh rotary qknorm_rope)  # `tasks all`
declare -A FAMILY=([fuse]=fuse_scale_shift [norm_infer]=norm_infer [cutedsl]=cutedsl_norm_scale_shift
                   [group_norm_silu]=group_norm_silu [norm_tanh]=cutedsl_norm_tanh_mul_add [rotary]=rotary_embedding
                   [qknorm_rope]=qknorm_rope)
declare -A NEEDS=([cutedsl]="cutlass.cute" [qknorm_rope]="tvm_ffi")  # importable only from KP_SITE's wheels
# a task's run with its context (audit on), plus the run without: from harness 2.9-2.17's ~5 s a row and 10-15 s of
# audit per production row, three regimes a row, the first row's 14-31 s, the builds (norm_infer's nvcc,
# qknorm_rope's three tvm-ffi template sets a side, in each of its two runs); fuse's three rows took 134 s with
# contexts and the audit under 2.18 (benchmarks/README.md). group_norm_silu: six rows up to 570 MB a tensor, each
# context graph holding a 3x3x3 conv over the row's tensor (0.2-7.0 ms a replay on an H200 under 2.19); rotary: one row
# (estimates: remeasure.sh's runs under 2.19 took much longer, their audits overlapping: benchmarks/README.md)
declare -A ESTIMATE_S=([fuse]=200 [norm_infer]=300 [cutedsl]=300 [group_norm_silu]=360 [norm_tanh]=240 [rotary]=120
                       [qknorm_rope]=420)
AA_RUN_S=100  # one run of the 12 A/A rows in three regimes: 80-90 s on an H200 under 2.19 (benchmarks/README.md)
arch=""
ran=()

say() { echo "$*" | tee -a "$out/steps.txt"; }
left() { echo $((budget - SECONDS)); }
new_id() { echo "$(date -u +%Y%m%d-%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"; }

context_rows() {  # context_rows TASK_DIR: the production rows that name a context (dry: the smoke rows that do)
  "$py" -c 'import sys, tomllib
rows = tomllib.load(open(sys.argv[1] + "/bench/workloads.toml", "rb"))
merged = [{**rows.get("defaults", {}), **r} for r in rows["workload"]]
key = "smoke" if sys.argv[2] == "1" else "production"
print(",".join(r["id"] for r in merged if r.get("context") and r.get(key)))' "$1" "$dry"
}

copy_task() {  # copy_task SOURCE COPY [without]: the task; marked for this GPU's arch; its contexts dropped
  rm -rf "$2"; mkdir -p "$(dirname "$2")"; cp -r "$1" "$2"; rm -rf "$2/results" "$2/ledger.jsonl"
  [ -n "$arch" ] && sed -i "s/^arch = .*/arch = \"$arch\"/" "$2/task.toml"
  [ "${3:-}" = without ] && sed -i '/^context = /d' "$2/bench/workloads.toml"
  return 0
}

run_one() {  # run_one NAME TASK_DIR RUN_DIR AUDIT [RUNNER ARGS...]: one runner, time-boxed, logged
  local name=$1 task=$2 run=$3 audit=$4 t0=$SECONDS code; shift 4
  local args=(--task-dir "$task" --run-dir "$run" --root "$work/root" --host-alias context "$@")
  if [ "$dry" = 1 ]; then args+=(--device cpu); else args+=(--device cuda --audit "$audit"); fi
  mkdir -p "$work/logs"
  echo "$py -m kpremote.agent.run.runner ${args[*]}" > "$work/logs/$name.log"
  timeout -k 20 "$(left)" "$py" -m kpremote.agent.run.runner "${args[@]}" >> "$work/logs/$name.log" 2>&1
  code=$?
  ran+=("${run#"$work"/}" "logs/$name.log")
  say "$name: exit $code$([ $code = 124 ] && echo " (cut: the call's budget ran out)"), $((SECONDS - t0)) s"
}

step_tasks() {  # step_tasks LIST (all: ORDER)
  local name task source rows id list=" ${1//,/ } "
  list=${list// all / ${ORDER[*]} }
  for name in $list; do
    [ -n "${FAMILY[$name]:-}" ] || { say "tasks: '$name' is not one of: all ${ORDER[*]}"; continue; }
    task=h200_diffusion_${FAMILY[$name]}__multi_shape source=kernels/$task
    if [ "$(left)" -lt "${ESTIMATE_S[$name]}" ] && [ "$dry" != 1 ]; then
      say "$name: skipped, needs ~${ESTIMATE_S[$name]} s and $(left) s are left: 'tasks $name' in the next call"
      continue
    fi
    if [ ! -d "$source/baseline/upstream" ]; then
      say "$name: skipped, no $source/baseline/upstream: carry it (inv baseline --task $task --materialize here)"
      continue
    fi
    if [ -n "${NEEDS[$name]:-}" ] && ! "$py" -c "import ${NEEDS[$name]}" 2> /dev/null; then
      say "$name: skipped, cannot import ${NEEDS[$name]} (remeasure.sh's stage install on this warm machine first)"
      continue
    fi
    rows=$(context_rows "$source")
    if [ -z "$rows" ]; then
      if [ "$dry" = 1 ]; then say "$name: no smoke row of it names a context: nothing of it runs on the CPU (dry)"
      else say "$name: no production row of it names a context"; fi
      continue
    fi
    id=$(new_id)
    copy_task "$source" "$work/copies/with/$task"
    run_one "$name-with" "$work/copies/with/$task" "$work/runs/tasks/$task/with-$id" "${CONTEXT_AUDIT:-on}" \
      --workloads "$rows"
    if [ "${CONTEXT_COST:-1}" = 1 ]; then
      copy_task "$source" "$work/copies/without/$task" without
      run_one "$name-without" "$work/copies/without/$task" "$work/runs/tasks/$task/without-$id" off \
        --workloads "$rows"
      # the run with its context had the audit on; its cost beside this one is the rows' seconds, which the audit
      # (after every row) does not count
    fi
  done
}

step_aa() {  # step_aa [N]
  local runs=${1:-${CONTEXT_AA_RUNS:-3}} n id copy=$work/copies/$stamp/dial  # its own: two calls may share a work folder
  copy_task benchmarks/gpu/dial "$copy"
  if [ "$dry" = 1 ]; then  # the launch-bound rows only: the others are GPU-sized
    "$py" - "$copy/bench/workloads.h200-context-aa.toml" > "$copy/bench/workloads.toml" <<'PY'
import sys
text = open(sys.argv[1]).read()
head, *rows = text.split("[[workload]]")
print(head + "".join("[[workload]]" + r for r in rows if "n = 384\n" in r))
PY
  else
    cp "$copy/bench/workloads.${CONTEXT_AA_FILE:-h200-context-aa}.toml" "$copy/bench/workloads.toml" || exit 2
  fi
  for n in $(seq 1 "$runs"); do
    if [ "$(left)" -lt "$AA_RUN_S" ] && [ "$dry" != 1 ]; then
      say "aa: run $n of $runs not started, $(left) s left (~$AA_RUN_S s a run): 'aa' again in the next call"
      break
    fi
    id=$(new_id)
    run_one "aa-$id" "$copy" "$work/runs/aa/$id" off
  done
}

check_gpu() {  # the tasks' arch gate takes an H200 (or B200); an H100's copies are marked h100 (TASK EDITED)
  [ "$dry" = 1 ] && return 0
  local gpu; gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *H200*|*B200*) ;;
    *H100*) arch=h100; say "this GPU is '$gpu': the task copies are marked arch h100, so their runs say TASK EDITED" ;;
    *) say "context.sh: this machine's GPU is '${gpu:-none}', not an H200, B200 or H100: nothing run"; exit 3 ;;
  esac
}

finish() {
  {
    echo "# context.sh $stamp: $*"; echo
    cat "$out/steps.txt" 2>/dev/null; echo
    [ -d "$work/runs" ] && [ ${#ran[@]} -gt 0 ] &&
      "$py" benchmarks/gpu/context_report.py --root "$work/runs" \
        $(for p in "${ran[@]}"; do [[ $p == runs/* ]] && echo "$work/$p"; done)
  } > "$out/summary.md" 2>&1
  cat "$out/summary.md"
  [ ${#ran[@]} -gt 0 ] && tar czf "$out/context-$stamp.tgz" -C "$work" --exclude '*/raw/scratch' \
    --exclude '*/raw/build' --exclude '*.ncu-rep' --exclude '*/task' "${ran[@]}" 2>/dev/null
  return 0
}

mkdir -p "$out" "$work"; : > "$out/steps.txt"
# the tasks' upstream files, carried as one archive (remeasure.sh pack's, or `tar czf .gpustage/upstream.tgz
# kernels/*/baseline/upstream` here) where their folders were not carried one by one
for carried in .gpustage/upstream.tgz .gpustage/remeasure-*/upstream.tgz; do
  [ -f "$carried" ] && tar xzf "$carried"
done
# remeasure.sh's `stage install` left the wheels of cutedsl and qknorm_rope in KP_SITE on this warm machine
if [ -d "${KP_SITE:-/tmp/site}" ] && [ -f benchmarks/gpu/new_tasks.sh ]; then
  eval "$(KP_SITE=${KP_SITE:-/tmp/site} bash benchmarks/gpu/new_tasks.sh env)"
fi
{ nvidia-smi 2>&1 | head -20; "$py" -c 'import json, torch, triton; from kpremote.agent import harness
print(torch.__version__, torch.version.cuda, triton.__version__); print(json.dumps(harness.harness_record()))' 2>&1
} > "$out/machine.txt"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || { echo "context.sh: give steps: tasks LIST, aa [N]"; exit 2; }
check_gpu
i=0
while [ $i -lt ${#steps[@]} ]; do
  case "${steps[$i]}" in
    tasks) step_tasks "${steps[$((i + 1))]:-fuse}"; i=$((i + 2)) ;;
    aa) if [[ "${steps[$((i + 1))]:-}" =~ ^[0-9]+$ ]]; then step_aa "${steps[$((i + 1))]}"; i=$((i + 2))
        else step_aa; i=$((i + 1)); fi ;;
    *) say "context.sh: unknown step '${steps[$i]}' (tasks LIST, aa [N])"; i=$((i + 1)) ;;
  esac
done
finish "${steps[@]}"
