#!/usr/bin/env bash
# Issue 25 on the lent H200, one device call: whole runs of the dial task (benchmarks/gpu/dial) through
# `python -m kpremote.agent.run.runner` (audit off), alternating the process pairs per side (PAIRS, default "1 4":
# KPREMOTE_SIDE_PAIRS=1 is one pair per side as harness 2.8 timed, 4 is harness 2.9's default), for POWER_S seconds.
#   ROWS=power  bench/workloads.h200-power.toml: s4/s15/s200 x (aa1, aa2, d2, d5, d10) - the power curve
#   ROWS=aa     bench/workloads.h200-aa.toml: twelve A/A rows and two dial rows - the false-verdict rate
#   ROWS=tiny   bench/workloads.h200-tiny.toml: twelve A/A rows of 384 elements (launch-bound, as the red team's tiny row)
#   ROWS=goal   bench/workloads.h200-goal.toml: issue 25's goal levels (+5 % on s4, +2 % on s15 and s200) on the
#               four-GPU H200; ROWS=s15 its s15 row again with a spin that reads +2 % there
# Results: $OUT/pairs.tgz (p<K>/<i>/results.json, samples.jsonl, run.json); read them here with
#   python3 benchmarks/gpu/power_report.py DIR --tag p4 [--floors ...]
# WITH_27=1 runs harness 2.7's runner (.gpustage/h27, carried) on the same rows before this tree's in every round, as
# p/h27/<i>: the power curve of 2.7 and this version in one sitting (power_report.py DIR --tag h27, then --tag p4).
# POWER_AUDIT=on keeps the Nsight Compute audit on (every dial row is a production row): power_report.py's audit table
# then gives, per row, how far apart ncu reads the two sides' kernels (on A/A rows: ncu's own noise) and how much more
# the candidate's window holds beyond its kernels than the baseline's.
# POWER_WORK (default /tmp/kp-pairs) is this copy's work folder: on a host of several GPUs, copies with folders of
# their own, one POWER_ROOT (their lease root) and each its POWER_GPU (an index: the runner's --gpu) run at once.
set -uo pipefail
work=${POWER_WORK:-/tmp/kp-pairs}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 POWER_WORK=$work
out=${OUT:-/tmp/kp-pairs-out}; mkdir -p "$out"
h27=$PWD/.gpustage/h27
if [ "${WITH_27:-0}" = 1 ] && [ ! -d "$h27/kpremote" ]; then
  echo "power_pairs.sh: WITH_27=1 needs .gpustage/h27 (bash benchmarks/gpu/cost_27.sh pack here, then carry it)"; exit 2
fi
rm -rf "$work"; mkdir -p "$work/kernels"
cp -r benchmarks/gpu/dial "$work/kernels/dial"
cp "benchmarks/gpu/dial/bench/workloads.h200-${ROWS:-power}.toml" "$work/kernels/dial/bench/workloads.toml"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'from kpremote.agent import harness; print(harness.harness_record())'; } > "$out/machine.txt" 2>&1
end=$(( $(date +%s) + ${POWER_S:-420} ))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  i=$((i + 1))
  if [ "${WITH_27:-0}" = 1 ]; then  # harness 2.7's runner on the same rows, before this tree's, every round
    POWER_AGENT=$h27 OUT=$work/out python3 benchmarks/gpu/power.py runs --seconds 1 --tag "h27-$i" --audit "${POWER_AUDIT:-off}"
  fi
  for k in ${PAIRS:-1 4}; do
    [ "$(date +%s)" -lt "$end" ] || break
    KPREMOTE_SIDE_PAIRS=$k OUT=$work/out python3 benchmarks/gpu/power.py runs --seconds 1 --tag "p$k-$i" --audit "${POWER_AUDIT:-off}"
  done
done
cd "$work/out/power" && for d in p*-* h27-*; do
  [ -d "$d" ] || continue
  mkdir -p "$out/p/${d%-*}/${d##*-}"; cp "$d"/1/* "$out/p/${d%-*}/${d##*-}/"
done
tar czf "$out/pairs.tgz" -C "$out" p machine.txt && rm -rf "$out/p"
