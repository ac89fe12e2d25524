#!/usr/bin/env bash
# Issue 25, one device call: whether a side process's own offset belongs to its stream. Whole runs of the dial task
# (its H200 rows: bench/workloads.h200.toml, spins from an earlier calibrate) alternate KPREMOTE_SAMPLE_STREAMS=1 (every
# sample on the side's current stream) and =4 (samples rotate over four streams), audit off, for POWER_S seconds.
# Results: $OUT/streams.tgz (streams-K/<i>/results.json, samples.jsonl); read with power_report.py --tag streams-K.
set -uo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 POWER_WORK=/tmp/kp-streams
out=${OUT:-/tmp/kp-streams-out}; mkdir -p "$out"
rm -rf /tmp/kp-streams; mkdir -p /tmp/kp-streams/kernels
cp -r benchmarks/gpu/dial /tmp/kp-streams/kernels/dial
cp benchmarks/gpu/dial/bench/workloads.h200.toml /tmp/kp-streams/kernels/dial/bench/workloads.toml
end=$(( $(date +%s) + ${POWER_S:-420} ))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  i=$((i + 1))
  for k in 1 4; do
    KPREMOTE_SAMPLE_STREAMS=$k OUT=/tmp/kp-streams/out python3 benchmarks/gpu/power.py runs --seconds 1 --tag "streams-$k-$i"
  done
done
cd /tmp/kp-streams/out/power && for d in streams-*; do mkdir -p "$out/s/${d%-*}/${d##*-}"; cp "$d"/1/* "$out/s/${d%-*}/${d##*-}/"; done
tar czf "$out/streams.tgz" -C "$out" s && rm -rf "$out/s"
