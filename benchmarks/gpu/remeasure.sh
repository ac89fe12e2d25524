#!/usr/bin/env bash
# Re-measure the seven H200 tasks of kernels/ under a new harness version (issue 25 item 5, issue 28 items 1-2) on a
# lent H200 (one GPU, or several with REMEASURE_PARALLEL=1: since 2.14 two calls on a four-GPU H200 host, each
# version's commands in benchmarks/README.md), in as few device calls as the device allows: each task's every row (production rows and
# regression grid) with the Nsight Compute audit on, through `python -m kpremote.agent.run.runner` on that machine
# (fresh judge and side processes per task, no SSH), and the red team's timing attacks on its ~2 us `tiny` row.
# Run from the repository root:
#   bash benchmarks/gpu/remeasure.sh STEP...            e.g.  stage tasks fuse,group_norm_silu
# Steps (in the order given; each time-boxed so a call ends inside REMEASURE_BUDGET_S, default 540 s):
#   pack            HERE, before the calls: .gpustage/remeasure-{1,2,3}/, one carry path each: the upstream
#                   files of every task in each (a call stands alone), the wheels split over 2 and 3
#   stage           GPU: the carried wheels of .gpustage/remeasure-*/whl into KP_WHEELS (/tmp/kp-wheels)
#   install         GPU: install them into KP_SITE (/tmp/site) through `benchmarks/gpu/new_tasks.sh install`
#   tasks LIST      GPU: each task of LIST (comma-separated: fuse, group_norm_silu, qknorm_rope, cutedsl,
#                   norm_infer, rotary, norm_tanh) once, every row, audit on. `all`: every task with no finished run (exit 0
#                   or 1) on this warm machine yet, in that order. A task whose estimate (below) no longer fits the
#                   call's budget is skipped and says so; the one that starts gets all the time left
#   profile T:R,... GPU: each task T's row R, both sides under Nsight Compute (`python -m kpremote.agent.run.profile`,
#                   what `inv profile` runs on a host: build, gate, ncu; summary/profile.md with bytes, bandwidth and
#                   the bound, as issue 28 asks of a no-go), e.g. profile qknorm_rope:flux_img_t4096_h24_d128
#   redteam         GPU: RT_LIST (default RT_DEFAULT: eight attacks) on the `tiny` row, audit on, via redteam.sh;
#                   attacks already recorded on this warm machine are skipped, so a second call goes on
# Every call: the GPU is checked to be an H200 first (the tasks' arch gate refuses others: nothing runs);
# machine.txt (nvidia-smi, versions, ncu, harness_record()), summary.md (per task: exit, rows passed, grid passed,
# headline, seconds; the tasks left on this machine; the red team's table), and remeasure-<UTC time>.tgz (this
# call's runs without raw/scratch, raw/build, .ncu-rep files; the logs; the red team's records) land in $OUT:
# four files with steps.txt (the device brings back eight).
#
# Time per task (the estimates the budget uses), from harness 2.9 on the lent H200 (benchmarks/README.md: ~5 s a
# row, 14-31 s for the first row, which starts the judge and four process pairs a side, 10-15 s of audit per
# production row; fuse's 30 rows ran inside h200_29.sh's 240 s) plus each build: fuse 30 rows (4 production)
# ~240 s; group_norm_silu 19 (6) ~200 s, never run on a GPU before; rotary 19 (4) ~180 s; norm_infer 24 (2)
# ~240 s with its nvcc build; cutedsl 13 (4) ~200 s with cute.compile; qknorm_rope 16 (4) ~420 s, the least
# known: its tvm-ffi modules are built per row's template arguments, 12 sets for 16 rows, one nvcc each a side;
# the red team, 8 one-row runs with the audit, ~350 s. About 26 minutes of rows in all, 32 with the red team (under
# 2.19, with the production rows in context and two audited jobs on one host: ~44 minutes, ESTIMATE_S below):
# four calls of at most ~9 minutes. The wheels of qknorm_rope and cutedsl (~112 MB: two carries of at most
# 64 MiB) must meet on one warm machine (given back after 30 s idle and after 30 minutes held: make the calls back
# to back), so they ride in calls 1 and 2 and their tasks run in call 2, while the machine is young; calls 3 and
# 4 need only the upstream files, on that machine or a fresh one.
#   here:   bash benchmarks/gpu/remeasure.sh pack  (from kernels/*/baseline/upstream and KP_WHL, default .whl)
#   call 1: carry [.gpustage/remeasure-2]  bash benchmarks/gpu/remeasure.sh stage tasks fuse,group_norm_silu
#   call 2: carry [.gpustage/remeasure-3]  bash benchmarks/gpu/remeasure.sh stage install tasks qknorm_rope,cutedsl
#   call 3: carry [.gpustage/remeasure-1]  bash benchmarks/gpu/remeasure.sh tasks norm_infer,rotary redteam
#   call 4: carry []                       bash benchmarks/gpu/remeasure.sh redteam
# (timeout_s 600 each; the red team in call 3 takes what time is left, call 4 only if device time remains.) Each
# summary.md names the tasks left on its machine: a task skipped or cut goes into the next call's list (`tasks
# all` on the same warm machine; on a fresh one, name them); `redteam` goes on where the last one stopped on the
# same machine (on a fresh one, RT_LIST= the attacks not yet in the last table). If call 2 says the wheels are
# incomplete (the machine was fresh), call 1's carry must be staged again first: `stage` with
# .gpustage/remeasure-2, then call 2 again.
# Then here, for each call's files: python benchmarks/gpu/results_md.py import <files_at>/remeasure-*.tgz
# (kernels/<task>/results/<host>/<run-id>/ and each task's docs/results.md + docs/speedup.png, rendered from
# results.json; a run that does not count, its grid failed or cut, is imported but its docs are left as they
# were, exit 1).
#
# Environment: OUT (default /tmp/kp-remeasure-out); REMEASURE_WORK (/tmp/kp-remeasure: task copies, runs, logs);
# REMEASURE_BUDGET_S (540); REMEASURE_HOST (the runs' host alias and results/<host>/ folder, default h200);
# REMEASURE_ROWS (a --workloads list for every task, or `production`: each task's production rows; a trial, never
# committable); REMEASURE_ARCH=h100 (an H100 host: each copy's task.toml marked h100, so its runs say TASK EDITED: a
# harness measurement on the tasks' rows, never a task's result); REMEASURE_DRY=1 (this machine
# without a GPU: --device cpu, each task's first smoke row, no H200 check; RT on the CPU: the controls only);
# RT_LIST, RT_S (the red team's list and its own limit); KP_WHEELS, KP_SITE as new_tasks.sh reads them; PYTHON;
# REMEASURE_PARALLEL=1 (a host of several GPUs: `tasks LIST` starts every task at once and `redteam` runs beside
# them, each runner leasing an idle GPU of its own through one lease root; at most one job per GPU: the lease
# refuses the rest, NoIdleGpu). Since harness 2.14 the H200 re-measure runs this way on a lent four-GPU H200 host.
# REMEASURE_PARALLEL=chain: the tasks of LIST one after another in one job (one GPU at a time), the red team beside
# them (another GPU): a two-GPU host (benchmarks/gpu/x2_44.sh).
set -uo pipefail
[ -f benchmarks/gpu/remeasure.sh ] && [ -d kernels ] || { echo "remeasure.sh: run it from the repository root"; exit 2; }
out=${OUT:-/tmp/kp-remeasure-out}
work=${REMEASURE_WORK:-/tmp/kp-remeasure}
budget=${REMEASURE_BUDGET_S:-540}
host=${REMEASURE_HOST:-h200}; [ "${REMEASURE_DRY:-0}" = 1 ] && host=${REMEASURE_HOST:-cpu-dry}
py=${PYTHON:-python3}
dry=${REMEASURE_DRY:-0}
parallel=${REMEASURE_PARALLEL:-0}
export KP_WHEELS=${KP_WHEELS:-/tmp/kp-wheels} KP_SITE=${KP_SITE:-/tmp/site}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
stamp=$(date -u +%Y%m%d-%H%M%S)
steps_tsv=$work/steps-$stamp.tsv

ORDER=(fuse group_norm_silu qknorm_rope cutedsl norm_infer rotary norm_tanh)  # `tasks all`: the wheels' tasks while they are installed
declare -A FAMILY=([fuse]=fuse_scale_shift [rotary]=rotary_embedding [norm_infer]=norm_infer
                   [group_norm_silu]=group_norm_silu [qknorm_rope]=qknorm_rope [cutedsl]=cutedsl_norm_scale_shift
                   [norm_tanh]=cutedsl_norm_tanh_mul_add)
# What whole runs took under 2.19 on a two-H200 host with another audited job beside them (benchmarks/README.md,
# "harness 2.19 on a two-H200 host": group_norm_silu 494 s, rotary 412 s, norm_tanh 302 s, norm_infer 263 s; fuse cut
# at 254 s in its wan row's audit): the audit (~56 s a production row, two audits sharing one host) is most of it.
# qknorm_rope and cutedsl under 2.20, the same way ("harness 2.20 and 2.21"): 411 s and 304 s
declare -A ESTIMATE_S=([fuse]=300 [group_norm_silu]=500 [rotary]=420 [norm_infer]=270 [qknorm_rope]=440 [cutedsl]=330
                       [norm_tanh]=310)
declare -A NEEDS=([qknorm_rope]="tvm_ffi" [cutedsl]="cutlass.cute")  # importable only from KP_SITE's wheels
# issue 25's seven timing attacks, and 2.10's forge_timer_in_call (a forge that puts the timers back after each call)
RT_DEFAULT=control_fast,control_same,forge_event_times_10,forge_event_times_30,forge_timer_in_call,side_stream,sleep_first_call,patch_timer_stats
# The wheels of new_tasks.sh, split into two carries of at most 64 MiB (W: the cu13 libs, split in three parts).
W=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
WHEELS_2=("parts/$W.partaa" "apache_tvm_ffi-*.whl" "nvidia_cutlass_dsl-4*.whl" "nvidia_cutlass_dsl_libs_base-*.whl"
          "nvidia_cutlass_dsl_libs_core-*.whl" "cuda_bindings-*.whl" "cuda_pathfinder-*.whl" "einops-*.whl")
WHEELS_3=("parts/$W.partab" "parts/$W.partac" "protobuf-*.whl")

say() { echo "$*" | tee -a "$out/steps.txt"; }
left() { echo $((budget - SECONDS)); }
task_dir() { echo "kernels/h200_diffusion_${FAMILY[$1]}__multi_shape"; }

# --------------------------------------------------------------------------------------------- here: pack

step_pack() {  # the carries: upstream files of every task in each (calls stand alone), the wheels in 2 and 3
  local whl=${KP_WHL:-.whl} n t missing=0
  for n in "${ORDER[@]}"; do
    t=$(task_dir "$n")
    [ -d "$t/baseline/upstream" ] || { echo "pack: $t/baseline/upstream is missing: inv baseline --materialize --task $(basename "$t")"; missing=1; }
  done
  [ "$missing" = 0 ] || exit 2
  rm -rf .gpustage/remeasure-1 .gpustage/remeasure-2 .gpustage/remeasure-3
  for n in 1 2 3; do
    mkdir -p ".gpustage/remeasure-$n/whl" ".gpustage/remeasure-$n/stamps"
    tar czf ".gpustage/remeasure-$n/upstream.tgz" kernels/*/baseline/upstream
    for t in kernels/*/; do  # each task's provenance with its pin (HEAD's task digest): the GPU copy has no git
      "${PYTHON:-python3}" -c 'import json, sys; from kpremote.agent.provenance import task_provenance
print(json.dumps(task_provenance(sys.argv[1])))' "$t" > ".gpustage/remeasure-$n/stamps/$(basename "$t").json" || exit 2
    done
  done
  pack_wheels "$whl" 2 "${WHEELS_2[@]}" && pack_wheels "$whl" 3 "${WHEELS_3[@]}" || exit 2
  du -sh .gpustage/remeasure-*
  git check-ignore -q .gpustage/remeasure-1 || echo "pack: .gpustage is not ignored here: add /.gpustage/ to .git/info/exclude"
}

pack_wheels() {  # pack_wheels DIR N PATTERN...: each pattern's one file under DIR into .gpustage/remeasure-N/whl
  local whl=$1 n=$2 pattern file; shift 2
  for pattern in "$@"; do
    file=$(compgen -G "$whl/$pattern" | head -1)
    [ -n "$file" ] || { echo "pack: no $whl/$pattern (KP_WHL names the folder of new_tasks.sh's wheels)"; return 1; }
    cp -l "$file" ".gpustage/remeasure-$n/whl/" 2>/dev/null || cp "$file" ".gpustage/remeasure-$n/whl/"
  done
  local bytes tree  # a call carries 64 MiB in all, the working tree's tracked files included
  bytes=$(du -sb ".gpustage/remeasure-$n" | cut -f1)
  tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  [ $((bytes + tree)) -lt $((64 * 1024 * 1024)) ] ||
    { echo "pack: .gpustage/remeasure-$n ($bytes bytes) and the tree ($tree) are over a call's 64 MiB"; return 1; }
}

# --------------------------------------------------------------------------------------------- GPU: wheels

step_stage() {
  mkdir -p "$KP_WHEELS"
  local found; found=$(find .gpustage -path '*/remeasure-*/whl/*' -type f 2>/dev/null)
  [ -n "$found" ] || { say "stage: no .gpustage/remeasure-*/whl carried in this call"; return; }
  echo "$found" | xargs -I{} cp {} "$KP_WHEELS/"
  say "stage: $(echo "$found" | wc -l) files into $KP_WHEELS ($(find "$KP_WHEELS" -type f | wc -l) there now)"
}

step_install() {
  local t0=$SECONDS
  timeout 180 bash benchmarks/gpu/new_tasks.sh install > "$work/logs/install.log" 2>&1
  local code=$?
  say "install: exit $code, $((SECONDS - t0)) s$([ $code = 0 ] || echo ": $(tail -1 "$work/logs/install.log")")"
  [ $code = 0 ] || say "install: the wheels of both carries must be staged on this warm machine: carry .gpustage/remeasure-2 and -3 with 'stage' (a fresh machine lost them)"
}

copy_task() {  # copy_task TASK COPY: the task, stamped as a sync stamps it (its pin from 'pack'), else TASK UNPINNED
  local stamp; stamp=$(compgen -G ".gpustage/remeasure-*/stamps/$1.json" | head -1)
  cp -r "kernels/$1" "$2"
  [ -n "$stamp" ] && mkdir -p "$2/.kpremote" && cp "$stamp" "$2/.kpremote/provenance.json"
  # REMEASURE_ARCH=h100: a copy marked for another GPU, which its run records as TASK EDITED (task.toml changed)
  [ -n "${REMEASURE_ARCH:-}" ] && sed -i "s/^arch = .*/arch = \"$REMEASURE_ARCH\"/" "$2/task.toml"
  return 0
}

site_env() { [ -d "$KP_SITE" ] && eval "$(bash benchmarks/gpu/new_tasks.sh env)"; }

# --------------------------------------------------------------------------------------------- GPU: tasks

step_tasks() {  # step_tasks LIST
  local list=$1 name
  [ "$list" = all ] && list=$(tasks_left)
  if [ "$parallel" = 1 ]; then  # every task at once, each runner leasing an idle GPU of its own (one root)
    for name in ${list//,/ }; do run_task "$name" & sleep 2; done
    return
  fi
  if [ "$parallel" = chain ]; then  # one after another on one GPU, beside the red team (or another job) on another
    ( for name in ${list//,/ }; do run_task "$name"; done ) &
    return
  fi
  for name in ${list//,/ }; do run_task "$name"; pack; done
}

tasks_left() {  # the tasks with no finished run (exit 0 or 1) on this machine yet, in ORDER
  local name left=()
  for name in "${ORDER[@]}"; do
    cut -f1,3 "$work"/steps-*.tsv 2>/dev/null | grep -qE "/$(basename "$(task_dir "$name")")"$'\t'"[01]\$" ||
      left+=("$name")
  done
  echo "${left[*]}"
}

run_task() {
  local name=$1 task; task=$(basename "$(task_dir "$name")")
  local copy=$work/kernels/$task run_id logged t0=$SECONDS
  run_id=$(date -u +%Y%m%d-%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  local run=$work/runs/$task/$run_id need=${ESTIMATE_S[$name]} limit
  [ "$dry" = 1 ] && need=30
  if [ "$(left)" -lt "$need" ]; then
    say "$name: skipped, needs ~$need s and $(left) s are left in this call: run 'tasks $name' in the next call"
    return
  fi
  if [ ! -d "kernels/$task/baseline/upstream" ]; then
    say "$name: skipped, no kernels/$task/baseline/upstream: carry .gpustage/remeasure-N (made by 'pack' here)"
    return
  fi
  if [ -n "${NEEDS[$name]:-}" ] && ! "$py" -c "import ${NEEDS[$name]}" 2> /dev/null; then
    say "$name: skipped, cannot import ${NEEDS[$name]}: stage both wheel carries and 'install' on this warm machine"
    return
  fi
  rm -rf "$copy"; mkdir -p "$work/kernels" "$work/runs/$task"
  copy_task "$task" "$copy"
  local args=(--task-dir "$copy" --run-dir "$run" --root "$work/root" --host-alias "$host")
  if [ "$dry" = 1 ]; then
    args+=(--device cpu --workloads "${REMEASURE_ROWS:-$(first_smoke_row "$copy")}")
  else
    args+=(--device cuda --audit on)
    if [ "${REMEASURE_ROWS:-}" = production ]; then args+=(--workloads "$(production_rows "$copy")")
    elif [ -n "${REMEASURE_ROWS:-}" ]; then args+=(--workloads "$REMEASURE_ROWS"); fi
  fi
  limit=$(left)
  logged=$work/logs/$task-$run_id.log
  echo "$py -m kpremote.agent.run.runner ${args[*]}" > "$logged"
  timeout -k 20 "$limit" "$py" -m kpremote.agent.run.runner "${args[@]}" >> "$logged" 2>&1
  local code=$?
  printf '%s\t%s\t%s\t%s\n' "$copy" "$run" "$code" "$((SECONDS - t0))" >> "$steps_tsv"
  say "$name: exit $code$([ $code = 124 ] && echo " (cut at $limit s)"), $((SECONDS - t0)) s, run $run_id"
}

production_rows() {  # REMEASURE_ROWS=production: the task's production rows (a trial, never committable)
  "$py" -c 'import sys, tomllib
rows = tomllib.load(open(sys.argv[1] + "/bench/workloads.toml", "rb"))["workload"]
print(",".join(r["id"] for r in rows if r.get("production")))' "$1"
}

first_smoke_row() {  # the dry run's one row: the task's first smoke row
  "$py" -c 'import sys, tomllib
rows = tomllib.load(open(sys.argv[1] + "/bench/workloads.toml", "rb"))["workload"]
print(next(r["id"] for r in rows if r.get("smoke")))' "$1"
}

# --------------------------------------------------------------------------------------------- GPU: profiles

step_profile() {  # step_profile NAME:ROW,...: each row's both sides under Nsight Compute (`inv profile`'s runner)
  local item name row task copy run t0 limit code
  for item in ${1//,/ }; do
    name=${item%%:*} row=${item#*:} t0=$SECONDS
    task=h200_diffusion_${FAMILY[$name]}__multi_shape copy=$work/kernels/h200_diffusion_${FAMILY[$name]}__multi_shape
    if [ "$(left)" -lt "${PROFILE_S:-90}" ]; then say "profile $item: skipped, $(left) s left in this call"; continue; fi
    if [ -n "${NEEDS[$name]:-}" ] && ! "$py" -c "import ${NEEDS[$name]}" 2> /dev/null; then
      say "profile $item: skipped, cannot import ${NEEDS[$name]}: stage and install the wheels on this warm machine"
      continue
    fi
    [ -d "$copy" ] || { mkdir -p "$work/kernels"; copy_task "$task" "$copy"; }
    run=$work/profiles/$name-$row; rm -rf "$run"; mkdir -p "$work/profiles"
    limit=$(left)
    timeout -k 20 "$limit" "$py" -m kpremote.agent.run.profile --profile '{"side": "both", "section_set": "basic"}' \
      --task-dir "$copy" --run-dir "$run" --root "$work/root" --host-alias "$host" --device cuda --workloads "$row" \
      > "$work/logs/profile-$name-$row.log" 2>&1
    code=$?
    say "profile $item: exit $code, $((SECONDS - t0)) s$([ -f "$run/summary/profile.md" ] && echo ", summary/profile.md written")"
  done
}

# --------------------------------------------------------------------------------------------- GPU: red team

step_redteam() {
  local limit=${RT_S:-$(left)} t0=$SECONDS
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -lt 60 ]; then say "redteam: skipped, $(left) s left in this call: run 'redteam' in the next call"; return; fi
  local device=cuda; [ "$dry" = 1 ] && device=cpu
  OUT=$work/redteam WORK=$work/redteam-work REDTEAM_SKIP_DONE=1 REDTEAM_WORKLOADS=tiny REDTEAM_DEVICE=$device \
    REDTEAM_RUNNER_ARGS="$([ "$dry" = 1 ] || echo --audit on) --root $work/root" \
    timeout -k 20 "$limit" bash benchmarks/gpu/redteam.sh "${RT_LIST:-$RT_DEFAULT}" > "$work/logs/redteam.log" 2>&1
  local code=$?
  say "redteam: exit $code$([ $code = 124 ] && echo " (cut at $limit s: run 'redteam' again, it goes on)"), $((SECONDS - t0)) s"
}

# --------------------------------------------------------------------------------------------- what comes back

summarize() {
  {
    echo "# remeasure $stamp: $*"; echo
    cat "$out/steps.txt" 2>/dev/null; echo
    [ -s "$steps_tsv" ] && "$py" benchmarks/gpu/results_md.py table "$steps_tsv"
    echo; echo "left on this machine (no finished run here yet): $(tasks_left | tr ' ' ,)"
    [[ " $* " == *" redteam "* ]] && [ -f "$work/redteam/redteam.md" ] && { echo; cat "$work/redteam/redteam.md"; }
  } > "$out/summary.md" 2>&1
  cat "$out/summary.md"
}

pack() {  # everything of this call but the runs' scratch, builds and ncu reports, in one tarball under $OUT
  local kept=()  # this call's runs only: an earlier call on the same warm machine brought its own back
  mapfile -t kept < <(cd "$work" && { [ -f "$steps_tsv" ] && cut -f2 "$steps_tsv" | sed "s|^$work/||"
                      compgen -G 'logs'; compgen -G 'redteam'; compgen -G "steps-$stamp.tsv"; compgen -G 'profiles/*/summary'
                      compgen -G 'redteam-work/redteam.json'; compgen -G 'redteam-work/logs'; })
  [ ${#kept[@]} -gt 0 ] && tar czf "$out/remeasure-$stamp.tgz" -C "$work" --exclude '*/raw/scratch' \
    --exclude '*/raw/build' --exclude '*.ncu-rep' --exclude '*/task' "${kept[@]}" 2>/dev/null
}

machine() {
  {
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader 2>&1
    "$py" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
    "$py" -c 'from kpremote.agent import harness; print("harness", harness.harness_record())'
    echo "ncu: $(command -v ncu || echo 'not on PATH')"
    git log -1 --format='commit %H %s' 2>/dev/null || echo "no git history in this copy"
    echo "steps: $*"
  } > "$out/machine.txt" 2>&1
}

# --------------------------------------------------------------------------------------------- the steps

steps=() ; args=("$@")
[ ${#args[@]} -gt 0 ] || { echo "usage: $0 pack | [stage] [install] [tasks LIST] [redteam]"; exit 2; }
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    pack|stage|install|redteam) steps+=("${args[i]}") ;;
    profile)
      list=${args[i + 1]:-}
      [[ "$list" == *:* ]] || { echo "remeasure.sh: 'profile' needs TASK:ROW[,TASK:ROW...] (tasks: ${ORDER[*]})"; exit 2; }
      for item in ${list//,/ }; do
        [ -n "${FAMILY[${item%%:*}]:-}" ] || { echo "remeasure.sh: profile $item: no task '${item%%:*}' (${ORDER[*]})"; exit 2; }
      done
      steps+=("profile $list"); i=$((i + 1)) ;;
    tasks)
      list=${args[i + 1]:-}
      [ -n "$list" ] || { echo "remeasure.sh: 'tasks' needs a list (${ORDER[*]} or all)"; exit 2; }
      for name in ${list//,/ }; do
        [ "$name" = all ] || [ -n "${FAMILY[$name]:-}" ] || { echo "remeasure.sh: no task '$name' (${ORDER[*]} or all)"; exit 2; }
      done
      steps+=("tasks $list"); i=$((i + 1)) ;;
    *) echo "remeasure.sh: no step '${args[i]}' (pack, stage, install, tasks LIST, profile TASK:ROW,..., redteam)"; exit 2 ;;
  esac
done
if [ "${steps[*]}" = pack ]; then step_pack; exit 0; fi
[[ " ${steps[*]} " == *" pack "* ]] && { echo "remeasure.sh: 'pack' runs here, alone"; exit 2; }

mkdir -p "$out" "$work/logs"
for carried in .gpustage/remeasure-*/upstream.tgz; do [ -f "$carried" ] && tar xzf "$carried"; done
machine "$@"
if [ "$dry" != 1 ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case $gpu in
    *H200*) ;;
    *H100*) [ -n "${REMEASURE_ARCH:-}" ] ||
      { say "remeasure.sh: this machine's GPU is '$gpu', not an H200: the tasks' arch gate refuses it, nothing run (REMEASURE_ARCH=h100 measures task copies marked h100: TASK EDITED, a harness measurement, never a task's result)"; summarize "$@"; exit 3; } ;;
    *) say "remeasure.sh: this machine's GPU is '${gpu:-none}', not an H200: the tasks' arch gate refuses it, nothing run"
       summarize "$@"; exit 3 ;;
  esac
fi
trap 'pack; summarize "$@"' EXIT
site_env
for step in "${steps[@]}"; do
  case $step in
    stage) step_stage ;;
    install) step_install; site_env ;;
    redteam) if [ "$parallel" != 0 ]; then step_redteam & else step_redteam; fi ;;
    tasks\ *) step_tasks "${step#tasks }" ;;
    profile\ *) step_profile "${step#profile }" ;;
  esac
done
wait  # REMEASURE_PARALLEL=1: the tasks and the red team running at once
