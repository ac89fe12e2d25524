"""Where the trusted harness's extra ~100 ns on 4 us rows comes from (issue 11, cost): one small kernel
(torch.addcmul, the fuse_scale_shift shapes) timed the way each harness does it, interleaved, in one pair of
processes per repeat.

    python3 benchmarks/gpu/context_cost.py [--samples N] [--repeats R] [--variants a,b]   (on a GPU; markdown out)

Every sample: outputs poisoned, L2 flushed (a read of 2 x L2), head start (torch.cuda._sleep, 30 us), event,
kernel, event. The variants differ in who does the first two and whose memory the kernel uses:
  same       poison and flush queued in the timing process itself, no sync (the harness before issue 11)
  judge      poison and flush in another process (its own CUDA context), synced, then the sample (harness 2.0-2.3
             in shape, with the timing process's own tensors)
  ipc        as judge, on tensors the other process allocated and shared by CUDA IPC (harness 2.x: a pool per side)
  ipc+max    as ipc, then the timing process reads one byte per 64 KiB of each tensor's storage (a strided max
             per tensor, as first tried for harness 2.4) before the head start
  ipc+gather as ipc, the same bytes read by one index_select per tensor instead
  own+max    as judge, with ipc+max's reads
  judge+own  as judge, and the timing process also flushes in its own context (queued, no sync) before the head
             start: its last work before the timed call is its own again, as in `same`
  same+sync  as same, then a synchronize before the head start (the GPU idles between flush and sleep)
  warm       no poison and no flush at all
  copyK      as judge, on the K-th of four extra sets of the timing process's own tensors, each allocated after a
             64 MiB spacer (K = 0..3): one process, four placements
Per variant and shape: the median of each repeat, and the largest p90 and p99 over the repeats.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.multiprocessing as mp

VARIANTS = ("same", "judge", "ipc", "ipc+max", "ipc+gather", "own+max", "judge+own", "same+sync", "warm",
            "copy0", "copy1", "copy2", "copy3")
SHAPES = {"s19 (4 us)": (19, 3072), "s4096 (16 us)": (4096, 3072)}
STRIDE = 64 * 1024


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 60 * 2**20)


def make_row(tokens: int, channels: int) -> tuple[torch.Tensor, ...]:
    x = torch.randn(1, tokens, channels, device="cuda", dtype=torch.bfloat16)
    scale = torch.randn(1, 1, channels, device="cuda", dtype=torch.bfloat16)
    shift = torch.randn(1, 1, channels, device="cuda", dtype=torch.bfloat16)
    return x, scale, shift, torch.empty_like(x)


def judge_loop(conn) -> None:
    torch.cuda.init()
    flush = torch.zeros(2 * l2_bytes(), dtype=torch.uint8, device="cuda")
    shared = {label: make_row(*shape) for label, shape in SHAPES.items()}
    conn.send(shared)
    outputs = conn.recv()
    while True:
        msg = conn.recv()
        if msg[0] == "exit":
            return
        _, label, ipc = msg
        (shared[label][3] if ipc else outputs[label]).fill_(float("nan"))
        flush.max()
        torch.cuda.synchronize()
        conn.send("ok")


def storage_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device="cuda").set_(tensor.untyped_storage())


class Timing:
    def __init__(self, conn) -> None:
        self.conn = conn
        self.flush = torch.zeros(2 * l2_bytes(), dtype=torch.uint8, device="cuda")
        self.sleep = self.cycles_per_us() * 30
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.own = {label: make_row(*shape) for label, shape in SHAPES.items()}
        self.spacers, self.copies = [], []
        for _ in range(4):
            self.spacers.append(torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda"))
            self.copies.append({label: make_row(*shape) for label, shape in SHAPES.items()})
        self.ipc = conn.recv()
        conn.send({label: row[3] for label, row in self.own.items()})
        self.max_reads = {(k, label): [storage_bytes(t)[::STRIDE] for t in row]
                          for k, rows in (("own", self.own), ("ipc", self.ipc)) for label, row in rows.items()}
        self.gathers = {label: [(storage_bytes(t), torch.arange(0, storage_bytes(t).numel(), STRIDE, device="cuda"))
                                for t in row] for label, row in self.ipc.items()}

    @staticmethod
    def cycles_per_us() -> int:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        torch.cuda.synchronize()
        return int(1_000_000 / (start.elapsed_time(end) * 1000.0))

    def sample(self, variant: str, label: str) -> float:
        ipc = variant.startswith("ipc")
        rows = self.copies[int(variant[4:])] if variant.startswith("copy") else self.ipc if ipc else self.own
        x, scale, shift, out = rows[label]
        if variant.startswith("same"):
            out.fill_(float("nan"))
            self.flush.max()
            if variant == "same+sync":
                torch.cuda.synchronize()
        elif variant == "warm":
            pass
        else:
            self.conn.send(("sample", label, ipc))
            self.conn.recv()
            if variant == "judge+own":
                self.flush.max()
        if variant.endswith("+max"):
            for read in self.max_reads[("ipc" if ipc else "own", label)]:
                read.max()
        elif variant == "ipc+gather":
            for storage, offsets in self.gathers[label]:
                storage.index_select(0, offsets)
        torch.cuda._sleep(self.sleep)
        self.start.record()
        torch.addcmul(shift, x, scale, out=out)
        self.end.record()
        torch.cuda.synchronize()
        return self.start.elapsed_time(self.end) * 1000.0


def one_repeat(samples: int, variants: tuple[str, ...]) -> dict[tuple[str, str], list[float]]:
    parent, child = mp.Pipe()
    judge = mp.get_context("spawn").Process(target=judge_loop, args=(child,))
    judge.start()
    try:
        timing_side = Timing(parent)
        times: dict[tuple[str, str], list[float]] = {(v, s): [] for v in variants for s in SHAPES}
        for _ in range(20):  # warm-up, clocks up
            for key in times:
                timing_side.sample(*key)
        for _ in range(samples):
            for key in times:
                times[key].append(timing_side.sample(*key))
        parent.send(("exit",))
    finally:
        judge.join(timeout=30)
    return times


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    variants = tuple(args.variants.split(","))
    repeats = [one_repeat(args.samples, variants) for _ in range(args.repeats)]
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; {args.samples} samples per cell, "
          f"{args.repeats} process pairs")
    print("| shape | variant | median us, each repeat | spread | mean vs `same` | largest p90 | largest p99 |")
    print("|---|---|---|---|---|---|---|")
    for shape in SHAPES:
        base = statistics.mean(statistics.median(r[(variants[0], shape)]) for r in repeats)
        for variant in variants:
            medians = [statistics.median(r[(variant, shape)]) for r in repeats]
            p90 = max(quantile(r[(variant, shape)], 0.9) for r in repeats)
            p99 = max(quantile(r[(variant, shape)], 0.99) for r in repeats)
            spread = (max(medians) - min(medians)) / statistics.mean(medians) * 100
            print(f"| {shape} | {variant} | {' / '.join(f'{m:.3f}' for m in medians)} | {spread:.1f} % | "
                  f"{(statistics.mean(medians) / base - 1) * 100:+.2f} % | {p90:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
