#!/usr/bin/env bash
# Issue 25 on the lent GPU, one device call: the dial task's calibration, the empty-window probe, as many whole runs
# of the dial task as POWER_S seconds allow (audit off), and one audited run of three rows. Results under $OUT/power;
# read them here with `python3 benchmarks/gpu/power_report.py DIR/power`.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-/tmp/kp-power}; mkdir -p "$out/power"
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'from kpremote.agent import harness; print(harness.harness_record())'; } > "$out/power/machine.txt" 2>&1
python3 benchmarks/gpu/power.py calibrate > "$out/power/calibrate.log" 2>&1 || echo "calibrate failed" >> "$out/power/steps.txt"
python3 benchmarks/gpu/power.py probe --processes "${PROBE_N:-6}" > "$out/power/probe.log" 2>&1
python3 benchmarks/gpu/power.py runs --seconds "${POWER_S:-330}" 2>&1 | tee "$out/power/runs.log"
[ "${POWER_AUDIT:-1}" = 1 ] && python3 benchmarks/gpu/power.py runs --seconds 20 --audit on --tag audit \
  --workloads s4_aa1,s4_d10,s15_aa1 2>&1 | tee "$out/power/audit.log"
exit 0
