"""Where a side process's own offset lives (issue 25): per process, per stream, per kernel.

    python3 benchmarks/gpu/offset_probe.py --processes 8 > offsets.json     (on the GPU; ~1 min)

The dial's A/A rows (benchmarks/gpu/power.py) showed each run's two side processes reading one kernel a constant
-160..+224 ns apart, the same on a 5, a 16 and a 227 µs row. Each child process here times, the harness's way (the
L2 flushed, a head start, one event pair; translation reads before the head start), a one-block kernel (`one`) and
the dial's ~5 µs scale-and-shift (`s4`), on its default stream and on each of STREAMS new streams, round-robin. The
parent prints every process's medians: whether the offset follows the process, the stream, or the kernel; and
whether `one` predicts `s4` (a calibration kernel could then measure a context's offset).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STREAMS = 4

CHILD = r"""
import json, statistics, sys, importlib.util, torch
sys.path.insert(0, sys.argv[1])
from kpremote.agent.harness.timing import L2Flusher, TranslationReads, l2_bytes_of_device
spec = importlib.util.spec_from_file_location("dial_base", sys.argv[2])
base = importlib.util.module_from_spec(spec); spec.loader.exec_module(base)
flusher = L2Flusher(l2_bytes_of_device())
n = 393216
x, s, b, o = (torch.randn(n, device="cuda") for _ in range(4))
one = torch.zeros(1, device="cuda")
reads = TranslationReads([x, s, b, o, one])
kernels = {"one": lambda: one.add_(1.0), "s4": lambda: base.scale_shift(x, s, b, o)}
streams = [None] + [torch.cuda.Stream() for _ in range(int(sys.argv[3]))]
for k in kernels.values():
    k()
torch.cuda.synchronize()
times = {name: {i: [] for i in range(len(streams))} for name in kernels}
for _ in range(int(sys.argv[4])):
    for i, stream in enumerate(streams):
        for name, call in kernels.items():
            flusher.flush()
            target = stream if stream is not None else torch.cuda.default_stream()
            target.wait_stream(torch.cuda.default_stream())
            with torch.cuda.stream(target):
                reads.queue()
                torch.cuda._sleep(60000)
                a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); call(); e.record()
            e.synchronize()
            times[name][i].append(a.elapsed_time(e) * 1000.0)
print(json.dumps({name: [statistics.median(v) for v in per.values()] for name, per in times.items()}))
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/gpu/offset_probe.py")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--samples", type=int, default=120)
    args = parser.parse_args(argv)
    found = []
    for _ in range(args.processes):
        done = subprocess.run([sys.executable, "-c", CHILD, str(REPO),
                               str(REPO / "benchmarks" / "gpu" / "dial" / "baseline" / "kernel.py"), str(STREAMS),
                               str(args.samples)], capture_output=True, text=True, timeout=300)
        found.append(json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else
                     {"error": done.stderr[-1500:]})
        print(json.dumps(found[-1]), file=sys.stderr, flush=True)
    print(json.dumps(found, indent=1))
    ok = [f for f in found if "error" not in f]
    if ok:
        for name in ("one", "s4"):
            first = [f[name][0] for f in ok]
            spread = [statistics.mean(f[name][1:]) for f in ok]
            print(f"{name}: default stream per process {['%.3f' % v for v in first]}; mean over new streams "
                  f"{['%.3f' % v for v in spread]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
