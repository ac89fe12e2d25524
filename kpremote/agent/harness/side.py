"""One side of a run's rows in its own process: imports the adapter and ONE side's module, and only executes calls.

    python -m kpremote.agent.harness.side --fd N [--side S --run-dir R]

The judge (judge.py) starts one side process for the baseline and one for the candidate and talks to each
over a Unix socket (channel.py): commands come down pickled (the judge is trusted), replies go up as JSON
(the judge never unpickles them). A side never sees the other side's module (bind gets a placeholder that
raises when used), the seeds, the expected outputs, or the other side's tensors. Whatever a side reports
about itself is a raw sample time or an acknowledgement; every verdict and statistic is the judge's.
What a side reports can only make its own row fail (a crash, an exception, an output it replaced).
Before it reads its first command the process enters the sandbox (sandbox/): from then on it may change nothing
outside its scratch folder and touch no process outside its own tree.
The process imports once ("start") and then serves the rows the judge hands it ("row": the workload, and the
row's log for its stdout and stderr); the judge's cases of one row are dropped before the next.
The Nsight Compute audit starts its audited calls with the same command line (ncu/audit.py), the descriptor then
being no socket but the audit's job: main makes those calls (profiledcall.call_row) instead of serving a judge.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import seal
from .channel import Channel, ChannelClosed, decode_values

TRACEBACK_LINES = 20


class OtherSide:
    """Handed to the adapter's bind in place of the other side's module: this process may not call it."""

    def __init__(self, side: str) -> None:
        self._side = side

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"the {self._side} module is not loaded in this process (each side runs in its own)")


class Side:
    """The state of one side process: its adapter, its call, its cases, its timer."""

    def __init__(self) -> None:
        self.adapter: Any = None
        self.side = ""
        self.workload: dict[str, Any] = {}
        self.device = "cpu"
        self.cases: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.graphs: dict[int, Any] = {}
        self.mutates: dict[int, tuple[str, ...]] = {}  # per case: the inputs its calls rewrite in place
        self.translation_reads: dict[int, Any] = {}  # per case on a GPU: timing.TranslationReads of its tensors
        self.graph_calls = 1
        self.sleep_cycles = 0
        self.spec: Any = None
        self.context: Any = None  # the row's contract.Context (bench/context.py), when the row names one
        self.states: dict[int, dict[str, Any]] = {}  # per case: this side's copy of the context's state
        self.context_graphs: dict[int, Any] = {}  # per case on a GPU: before -> call -> after, captured
        self.context_reads: dict[int, Any] = {}  # per case on a GPU: the translation reads of its tensors and state
        self.clock: seal.Clock | None = None  # on a GPU: the timed window's C functions, taken at the seal

    # ---------------------------------------------------------------- commands

    def start(self, command: dict[str, Any]) -> dict[str, Any]:
        """Imports the adapter and this side's module, after the seal on this process's machinery is taken (seal.py):
        the reply carries the seal (taken out before it goes up) and whatever the imports broke of it."""
        import torch

        from ..task import build
        from ..task.taskspec import SIDES, load_task
        from . import contexts, correctness, rowlog, streamcheck, timing  # noqa: F401 - every harness module this side runs, sealed

        self.side, self.device = command["side"], command["device"]
        if self.device == "cuda":
            torch.cuda.init()
            self.clock = seal.Clock(torch)
        else:
            torch.set_num_threads(1)  # no intra-op pool on a smoke run: every other thread is the side's own
        entries = seal.take({"side": self, "clock": self.clock} if self.clock else {"side": self})
        spec = self.spec = load_task(Path(command["task_dir"]))
        module = build.import_side(spec, self.side, command.get("module_file"))
        self.adapter = build.import_adapter(spec)
        if callable(getattr(self.adapter, "bind", None)):
            modules = {side: module if side == self.side else OtherSide(side) for side in SIDES}
            self.adapter.bind(**modules)
        self._call_function = getattr(self.adapter, f"call_{self.side}")
        if self.device == "cuda":
            timing.reset_persisting_l2()  # once, after the side's module was imported: no set-aside, no such lines
        return {"ok": True, "sandbox": SANDBOX[0], SEAL_KEY: entries}

    def row(self, command: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """The next row: its workload's parameters, and its log (a descriptor the judge opened) for this process's
        output from now on."""
        from .rowlog import write_output_to_fd

        if fds:
            write_output_to_fd(fds[0])
        self.workload = command["workload"]
        self.cases.clear()
        self.graphs.clear()
        self.mutates.clear()
        self.translation_reads.clear()
        for kept in (self.states, self.context_graphs, self.context_reads):
            kept.clear()
        self.context = None
        if self.workload.get("context") is not None:
            from .contexts import load_context

            self.context = load_context(self.spec, self.workload["context"])
        return {"ok": True}

    def case(self, command: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        inputs = decode_values(command["inputs"], fds)
        outputs = decode_values(command["outputs"], fds)
        self.cases[command["id"]] = (inputs, outputs)
        self.mutates[command["id"]] = tuple(command.get("mutates") or ())
        self.graphs.pop(command["id"], None)
        if self.device == "cuda":
            from .timing import TranslationReads

            self.translation_reads[command["id"]] = TranslationReads([*inputs.values(), *outputs.values()])
        return {"ok": True}

    def drop(self, command: dict[str, Any]) -> dict[str, Any]:
        for kept in (self.cases, self.graphs, self.mutates, self.translation_reads, self.states, self.context_graphs,
                     self.context_reads):
            kept.pop(command["id"], None)
        return {"ok": True}

    def context_state(self, command: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """This side's copy of a case's context state (regimes.prepare), for the row's context regimes."""
        if self.context is None:
            return {"ok": False, "error": "this row names no context"}
        case_id = command["id"]
        self.states[case_id] = decode_values(command["state"], fds)
        self.context_graphs.pop(case_id, None)
        if self.device == "cuda":
            from .timing import TranslationReads

            inputs, outputs = self.cases[case_id]
            self.context_reads[case_id] = TranslationReads([*inputs.values(), *outputs.values(),
                                                            *self.states[case_id].values()])
        return {"ok": True}

    def capture_context(self, command: dict[str, Any]) -> dict[str, Any]:
        """The case's context as one CUDA graph: before -> call -> after."""
        from . import timing

        case_id = command["id"]
        if case_id not in self.states:
            return {"ok": False, "error": f"no context state for case {case_id}"}
        self.context_graphs[case_id], _ = timing.capture_graph(lambda: self._in_context(case_id), 1)
        return {"ok": True}

    def call(self, command: dict[str, Any]) -> dict[str, Any]:
        """One checked call: the judge poisoned the outputs; report a replaced or reshaped output."""
        inputs, outputs = self.cases[command["id"]]
        from .correctness import changed_output, layout_of

        before = {name: layout_of(t) for name, t in outputs.items()}
        held = dict(outputs)
        self._call(inputs, outputs)
        self._sync()
        return {"ok": True, "problem": changed_output(before, held, outputs)}

    def stream_check(self, command: dict[str, Any]) -> dict[str, Any]:
        from . import correctness, streamcheck

        inputs, outputs = self.cases[command["id"]]
        # The mutated inputs are watched like outputs (a late in-place write shows) but not poisoned: they are inputs.
        written = correctness.results_of(outputs, inputs, self.mutates.get(command["id"], ()))
        reason = streamcheck.stream_check(lambda: self._call(inputs, outputs), written,
                                          lambda _: correctness.poison_outputs(outputs))
        return {"ok": True, "reason": reason}

    def warm_up(self, command: dict[str, Any]) -> dict[str, Any]:
        """Untimed calls over the timing cases for warmup_s; returns the host's launch time (for the head start)."""
        ids = command["ids"]
        deadline = time.perf_counter() + float(command.get("seconds", 0.0))
        while True:
            for case_id in ids:
                self._call(*self.cases[case_id])
            self._sync()
            if time.perf_counter() >= deadline:
                break
        host_us = None
        if self.device == "cuda":
            from . import timing

            import torch

            host_us = timing._median_host_launch_us(lambda: self._call(*self.cases[ids[0]]), torch)
        return {"ok": True, "host_us": host_us}

    def head_start(self, command: dict[str, Any]) -> dict[str, Any]:
        from . import timing

        import torch

        self.sleep_cycles = int(float(command["us"]) * timing._cycles_per_us(torch))
        return {"ok": True}

    def capture(self, command: dict[str, Any]) -> dict[str, Any]:
        """A CUDA graph of n back-to-back calls on one case; an empty capture is refused."""
        from . import timing

        case_id, n_calls = command["id"], int(command["n"])
        inputs, outputs = self.cases[case_id]
        graph, empty = timing.capture_graph(lambda: self._call(inputs, outputs), n_calls)
        if empty:
            return {"ok": False, "error": "the CUDA graph is empty: the calls launched no GPU work under capture"}
        self.graphs[case_id] = graph
        self.graph_calls = n_calls
        return {"ok": True}

    def sample(self, command: dict[str, Any]) -> dict[str, Any]:
        """One timed sample: the judge flushed the L2 and poisoned the outputs; this side's address translations
        of the case are made warm, then microseconds of the call(s)."""
        case_id = command["id"]
        regime = command.get("regime", "cold")  # warm / context: a row with a context (regimes.py)
        if regime != "cold" and case_id not in self.states:
            return {"ok": False, "error": f"no context state for case {case_id}"}
        if self.device != "cuda":
            inputs, outputs = self.cases[case_id]
            now = PERF_COUNTER
            if regime == "warm":
                self._before(case_id)
            started = now()
            if regime == "context":
                self._in_context(case_id)
            else:
                self._call(inputs, outputs)
            return {"ok": True, "us": (now() - started) * 1e6}
        from . import timing

        # The persisting-L2 set-aside is read, not reset, here: a reset (cudaDeviceSetLimit +
        # cudaCtxResetPersistingL2Cache) before every sample put 7-45 us of its own work inside the next timed
        # window on an H200 (benchmarks/README.md, "Persisting L2"). The judge resets it in its own context before
        # every sample, this side reset it once at start, and a set-aside found here is the candidate's: caught.
        persisting = timing.persisting_l2_limit()
        graph = self.graphs.get(case_id) if command.get("graph") else None
        if command.get("graph") and graph is None:
            return {"ok": False, "error": f"no graph captured for case {case_id}"}
        if regime == "context":
            graph = self.context_graphs.get(case_id)
            if graph is None:
                return {"ok": False, "error": f"no context graph captured for case {case_id}"}
        # Everything the window calls once the side's call has returned is in this frame before the call, from
        # the Clock's C functions (seal.py): a patch the call makes cannot act before serve's check sees it.
        clock = self.clock
        record, query, synchronize, elapsed_ms, now, stream = (clock.record, clock.query, clock.synchronize,
                                                                clock.elapsed_ms, clock.now, clock.stream)
        start, end = clock.event_type(enable_timing=True), clock.event_type(enable_timing=True)
        (self.translation_reads if regime == "cold" else self.context_reads)[case_id].queue()  # before the head start
        if regime == "warm":
            self._before(case_id)  # the previous op, queued before the head start: its writes in the L2, untimed
        queueing = now()
        if self.sleep_cycles:
            clock.sleep(self.sleep_cycles)
        record(start, stream)
        if graph is not None:
            graph.replay()
        else:
            self._call(*self.cases[case_id])
        # The GPU already past the start event while this host was still queueing the call: the head start ran
        # out, and the window holds host time. The judge drops such a sample and lengthens the head start.
        late = query(start) if self.sleep_cycles else False
        host_us = (now() - queueing) * 1e6
        record(end, stream)
        synchronize()
        return {"ok": True, "us": elapsed_ms(start, end) * 1000.0, "late": late, "host_us": host_us,
                "persisting_l2_bytes": persisting}

    # ---------------------------------------------------------------- helpers

    def _call(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        self._call_function(self.workload, inputs, outputs)

    def _before(self, case_id: int) -> None:
        self.context.before(self.workload, self.states[case_id], self.cases[case_id][0])

    def _in_context(self, case_id: int) -> None:
        """The context's previous op, the call, the next op (on the call's results: outputs and mutated inputs)."""
        from .correctness import results_of

        inputs, outputs = self.cases[case_id]
        state = self.states[case_id]
        self.context.before(self.workload, state, inputs)
        self._call(inputs, outputs)
        self.context.after(self.workload, state, results_of(outputs, inputs, self.mutates.get(case_id, ())))

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


SEAL_KEY = "_seal"  # the start reply's seal, taken out by serve before the reply goes up
PERF_COUNTER = time.perf_counter  # the CPU window's clock, taken before any task code runs in this process
SANDBOX = ["unsandboxed: not entered"]  # what main() entered, in words, before any task code was imported

COMMANDS = {
    "start": Side.start, "drop": Side.drop, "call": Side.call, "stream_check": Side.stream_check,
    "warm_up": Side.warm_up, "head_start": Side.head_start, "capture": Side.capture, "sample": Side.sample,
    "capture_context": Side.capture_context,
}


def channel_changes(channel: Channel, kind: type, fields: dict[str, Any]) -> list[str]:
    """What task code changed of the channel a reply goes through: its class, an attribute replaced or added (a
    wrapped socket, a send_reply of the instance's own)."""
    if type(channel) is not kind:
        return ["the side's channel (its class)"]
    now, missing = vars(channel), object()
    changed = sorted(name for name in {*fields, *now} if now.get(name, missing) is not fields.get(name, missing))
    return [f"the side's channel ({name})" for name in changed]


def serve(channel: Channel) -> None:
    side = Side()
    # Bound here, before any task code runs: the check, its code, and (once "start" returns it) the seal. A
    # command's reply goes up only after the check, so a patch made during a command shows in that command's reply.
    check, check_code, entries = seal.broken, seal.broken.__code__, ()
    commands = dict(COMMANDS)
    # Trace, profile and monitoring hooks are refused from here on (seal.HookWatch); any attempted or in place is
    # named with the seal's names: such a hook sees sample()'s reply on its return event and could edit it.
    hooks = seal.HookWatch(tuple(f.__code__ for f in (serve, Side.case, Side.row, Side.context_state, Side._before,
                                                      Side._in_context, *COMMANDS.values())))
    hooks_set, hooks_code = hooks.set, seal.HookWatch.set.__code__
    # The channel itself: task code can reach it through this frame and wrap its socket (or shadow send_reply on
    # the instance), so what the reply goes through is the object bound here, checked before every reply.
    channel_type, channel_fields = type(channel), dict(vars(channel))
    while True:
        try:
            command, fds = channel.recv_command()
        except ChannelClosed:
            return
        op = command.get("op")
        if op == "exit":
            channel.send_reply({"ok": True})
            return
        try:
            if op == "case":
                reply = side.case(command, fds)
            elif op == "context":
                reply = side.context_state(command, fds)
            elif op == "row":
                reply = side.row(command, fds)
            else:
                reply = commands[op](side, command)
        except Exception as exc:  # noqa: BLE001 - the judge turns it into the row's ERROR
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": _traceback_tail(exc)}
        finally:
            import os

            for fd in fds:
                os.close(fd)
        if op == "start" and SEAL_KEY in reply:
            entries = reply.pop(SEAL_KEY)
        tampered = ["the seal's own check (its code)"] if check.__code__ is not check_code else check(entries)
        tampered += ["the hook watch (its code)"] if hooks_set.__func__.__code__ is not hooks_code else hooks_set()
        tampered += channel_changes(channel, channel_type, channel_fields)
        if tampered:
            reply["tampered"] = tampered
        channel.send_reply(reply)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m kpremote.agent.harness.side")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--side", help="which side (for people reading `ps`; the judge's start command decides)")
    parser.add_argument("--run-dir", help="the run folder (for people reading `ps`)")
    args = parser.parse_args(argv)
    from .. import sandbox

    audited = not stat.S_ISSOCK(os.fstat(args.fd).st_mode)  # no channel: the audit's calls under ncu, job on args.fd
    # before the adapter or the side's module is imported; under ncu the GPU's counters may be root's
    SANDBOX[0] = sandbox.enter(profiled=audited)
    if audited:
        from .profiledcall import call_from_fd, call_row

        print(f"side: {SANDBOX[0]}", file=sys.stderr, flush=True)
        return call_from_fd(args.fd, call_row)
    serve(Channel.from_fd(args.fd))
    return 0


def _traceback_tail(exc: BaseException) -> str:
    """The last TRACEBACK_LINES lines of exc's traceback; for an exception raised from another (Triton's interpreter
    wraps what a kernel's body raised), the first cause's own last lines after it: the line in the task's code that
    failed, not only the launch that reached it."""
    outer = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, chain=False)).splitlines()
    root, seen = exc, {id(exc)}
    while (root.__cause__ or root.__context__) is not None and id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
        seen.add(id(root))
    if root is exc:
        return "\n".join(outer[-TRACEBACK_LINES:])
    inner = "".join(traceback.format_exception(type(root), root, root.__traceback__, chain=False)).splitlines()
    half = TRACEBACK_LINES // 2
    return "\n".join([*outer[-half:], "raised from (the first cause):", *inner[-half:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
