#!/usr/bin/env bash
# Issue 44's GPU re-measure on a lent two-GPU host (nvidia-h200-x2; H100s too, their task copies marked h100), both
# GPUs busy in every device call of at most ~9.5 minutes. Run from the repository root:
#   here:   COST_OLD_COMMIT=d3bce19 bash benchmarks/gpu/cost_27.sh pack    (.gpustage/h27: harness 2.16's tree)
#           bash benchmarks/gpu/remeasure.sh pack                          (.gpustage/remeasure-1: upstream files)
#   call 1: carry [.gpustage/h27]         bash benchmarks/gpu/x2_44.sh aa
#           GPU 0: the dial's A/A rows (ROWS=aa, four pairs, audit off), harness 2.16 then this tree in every round
#           (WITH_27=1 with 2.16's tree): the false-verdict rate and each run's wall time, both versions on one GPU;
#           GPU 1: the same rows under this tree alone (the A/A count)
#   call 3: X2_OTHER='CONTEXT_WORK=/tmp/kp-x2 OUT=$OUT/context bash benchmarks/gpu/context.sh tasks fuse aa'
#           bash benchmarks/gpu/x2_44.sh tiny
#           GPU 0: the dial's twelve launch-bound A/A rows (ROWS=tiny, 384 elements: the red team's tiny row's size);
#           GPU 1: X2_OTHER's command (one lease root with the A/A copy)
#   call 2: carry [.gpustage/remeasure-1] RT_LIST=... bash benchmarks/gpu/x2_44.sh tasks LIST redteam
#           remeasure.sh with REMEASURE_PARALLEL=chain: the tasks of LIST one after another on one GPU, the red team
#           on the other (one lease root: each job leases the idle GPU)
#   jobs:   X2_PREP="stage install" X2_JOB_A='bash benchmarks/gpu/remeasure.sh tasks qknorm_rope'
#           X2_JOB_B='bash benchmarks/gpu/context.sh aa 3' bash benchmarks/gpu/x2_44.sh jobs
#           (issue 45's re-measure under 2.19): the prep alone, then the two jobs side by side, one per GPU
# Environment: X2_BUDGET_S (540: the call's own limit; A/A stops X2_AA_MARGIN_S=45 before it, for the packing).
# $OUT gets aa/ (pairs.tgz and machine.txt of each GPU's copy: aa/g0-pairs.tgz ...) or remeasure.sh's four files,
# and x2.log (every job's output). Here: python3 benchmarks/gpu/power_report.py DIR --tag h27 / --tag p4, and
# python3 benchmarks/gpu/results_md.py import remeasure-*.tgz.
set -uo pipefail
[ -f benchmarks/gpu/x2_44.sh ] || { echo "x2_44.sh: run it from the repository root"; exit 2; }
out=${OUT:-/tmp/kp-x2-out}; mkdir -p "$out"
budget=${X2_BUDGET_S:-540}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
count=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
echo "x2_44.sh $*: $count x ${gpu:-no GPU}, budget $budget s" | tee "$out/x2.log"

aa() {  # aa GPU WITH_27 [ROWS]: one copy of power_pairs.sh on GPU (its own work folder, one lease root for both)
  local g=$1 with=$2 rows=${3:-aa} folder=$out/aa/g$1
  mkdir -p "$folder"
  WITH_27=$with ROWS=$rows PAIRS=4 POWER_S=$((budget - ${X2_AA_MARGIN_S:-45})) POWER_RUN_LIMIT_S=200 POWER_GPU=$g \
    POWER_ROOT=${X2_ROOT:-/tmp/kp-x2/root} POWER_WORK=/tmp/kp-pairs-$g OUT=$folder bash benchmarks/gpu/power_pairs.sh \
    > "$folder.log" 2>&1
  echo "aa on GPU $g (WITH_27=$with): exit $?"
}

case ${1:-} in
  aa)
    [ -d .gpustage/h27/kpremote ] || { echo "x2_44.sh aa: carry .gpustage/h27 (cost_27.sh pack here)"; exit 2; }
    aa 0 1 & first=$!
    if [ "$count" -gt 1 ]; then aa 1 0 & second=$!; fi
    wait "$first" ${second:-}  # the jobs' own pids: a pgrep -f of a script name matches this command's shell too
    for g in 0 1; do
      [ -f "$out/aa/g$g/pairs.tgz" ] && mv "$out/aa/g$g/pairs.tgz" "$out/aa/g$g-pairs.tgz"
      [ -f "$out/aa/g$g/machine.txt" ] && mv "$out/aa/g$g/machine.txt" "$out/aa/g$g-machine.txt"
      [ -f "$out/aa/g$g.log" ] && { echo "--- GPU $g"; tail -40 "$out/aa/g$g.log"; } >> "$out/x2.log"
      rm -rf "$out/aa/g$g" "$out/aa/g$g.log"
    done ;;
  tiny)  # GPU 0: the dial's launch-bound A/A rows (ROWS=tiny); the other GPU: X2_OTHER (a command line), if given,
    # whose runners lease through the same root (X2_ROOT: context.sh's CONTEXT_WORK=/tmp/kp-x2 makes it so): they
    # take GPU 1 (the lease prefers the emptier GPU, the higher index on a tie), never the A/A copy's
    if [ -n "${X2_OTHER:-}" ]; then (bash -c "$X2_OTHER" > "$out/other.log" 2>&1; echo "other job: exit $?" >> "$out/other.log") & first=$!; fi
    aa 0 0 tiny
    wait ${first:-}
    [ -f "$out/aa/g0/pairs.tgz" ] && mv "$out/aa/g0/pairs.tgz" "$out/aa/g0-pairs.tgz"
    { echo "--- GPU 0"; tail -40 "$out/aa/g0.log"; [ -f "$out/other.log" ] && { echo "--- other"; tail -60 "$out/other.log"; }; } >> "$out/x2.log"
    rm -rf "$out/aa/g0" "$out/aa/g0.log" ;;
  tasks|redteam)
    case $gpu in *H100*) export REMEASURE_ARCH=h100 REMEASURE_HOST=h100 ;; esac
    REMEASURE_PARALLEL=chain REMEASURE_BUDGET_S=$budget bash benchmarks/gpu/remeasure.sh "$@" >> "$out/x2.log" 2>&1
    echo "remeasure.sh: exit $?" | tee -a "$out/x2.log" ;;
  jobs)  # two jobs side by side, one per GPU, through one lease root (REMEASURE_WORK's and CONTEXT_WORK's: /tmp/kp-x2),
    # after X2_PREP (remeasure.sh steps, e.g. "stage install", run first, alone): X2_JOB_A and X2_JOB_B are command
    # lines (remeasure.sh or context.sh), each given OUT=$out/a or $out/b and the call's time left as its budget
    export REMEASURE_WORK=/tmp/kp-x2 CONTEXT_WORK=/tmp/kp-x2 REMEASURE_PARALLEL=chain
    case $gpu in *H100*) export REMEASURE_ARCH=h100 REMEASURE_HOST=h100 ;; esac
    if [ -n "${X2_PREP:-}" ]; then
      OUT=$out/prep REMEASURE_BUDGET_S=$budget bash benchmarks/gpu/remeasure.sh $X2_PREP >> "$out/x2.log" 2>&1
      echo "prep ($X2_PREP): exit $?, $SECONDS s" | tee -a "$out/x2.log"; rm -rf "$out/prep"
    fi
    rest=$((budget - SECONDS))
    for job in A B; do
      line=X2_JOB_$job; [ -n "${!line:-}" ] || continue
      folder=$out/$(echo $job | tr AB ab); mkdir -p "$folder"
      (OUT=$folder REMEASURE_BUDGET_S=$rest CONTEXT_BUDGET_S=$rest bash -c "${!line}" > "$folder.log" 2>&1
       echo "job $job: exit $?" >> "$folder.log") &
      eval "pid_$job=\$!"; sleep 2  # a second apart: remeasure.sh names its steps file by the second it starts
    done
    wait ${pid_A:-} ${pid_B:-}
    [ -f "$out/a/machine.txt" ] && rm -f "$out/b/machine.txt"  # the device brings back eight files
    for job in a b; do [ -f "$out/$job.log" ] && { echo "--- job $job"; tail -60 "$out/$job.log"; } >> "$out/x2.log"; rm -f "$out/$job.log"; done ;;
  *) echo "usage: bash benchmarks/gpu/x2_44.sh aa | tiny | tasks LIST [redteam] | redteam | jobs"; exit 2 ;;
esac
cat "$out/x2.log"
