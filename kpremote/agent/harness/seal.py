"""The seal on a side's own machinery: what a side process runs to time a sample and report it, recorded before any
task code is imported, and the names that task code replaced since.

A side's samples are measured in the side's own process, where the candidate's code runs too: a module that
replaces `torch.cuda.Event.elapsed_time`, the JSON encoder or one of the harness's functions could shape the
numbers its side reports (the red team's forged timers). Two things stop that, both set up in side.start before
the adapter or either side's module is imported:
- `take` records every function and class of the harness modules the side runs, of the standard-library
  modules that carry a reply (json, pickle, socket, struct, array, time, builtins), and of torch.cuda's timing
  names, with each function's code and defaults, plus the attributes of the objects the side pins (its Clock, its
  own state). `broken` names each that is no longer what was recorded: replaced or deleted on its module,
  class or object, its code or defaults swapped. The side checks after every command, before its reply goes up
  (side.serve); the judge voids the timing of a row whose side broke its seal (judge.py: the row reads
  "invalid"). The check reads dictionaries and compares identities only, so a replaced builtin cannot blind it.
- `Clock` holds the few callables the timed window calls after the side's call returns (record the end event,
  synchronize, read the elapsed time, read the host clock), taken from torch's C extension, which no Python code
  can replace: a patch made during the call cannot act before the check that sees it. The check itself is bound
  in side.serve before any command, and the seal is a tuple handed back by the start command's own frame.

- `HookWatch` (since issue 44) keeps Python's own hooks out of the side: a trace, profile or monitoring function
  sees every frame's return value, so one set on sample()'s frame could edit the reply dict on its return event
  without replacing anything. An audit hook, installed before any task code runs, refuses `sys.settrace`,
  `sys.setprofile` (threading's hooks, and from 3.12 the all-threads forms, go through the same audit events) and
  `sys.monitoring.register_callback` (Python 3.12+), and records each attempt; its `set` names, after every
  command, each attempt and each hook found in place all the same (the trace and profile functions, threading's,
  an `f_trace` on the harness's frames, sys.monitoring's tools, events and the harness's local events).

What the seal does not cover: a candidate that writes the process's memory (ctypes: it could also install a hook
through the C API with no audit event, or rebind a frame's locals) or races a thread of its own against the reply. Those remain the Nsight Compute audit's, the helper-thread guard's
and the sandbox's (docs/trust.md, "What it does not defend").
"""

from __future__ import annotations

import sys
import types
from typing import Any

MISSING = object()
WATCHED_MODULES = ("json", "json.encoder", "json.decoder", "pickle", "socket", "struct", "array", "time", "builtins")
HARNESS = __name__.rpartition(".")[0]  # kpremote.agent.harness
TORCH_CUDA_NAMES = ("Event", "Stream", "CUDAGraph", "synchronize", "_sleep", "current_stream", "set_stream",
                    "stream", "graph")
TORCH_MODULES = ("torch.cuda.streams", "torch.cuda.graphs")
IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE
FUNCTIONS = (types.FunctionType,)
CALLABLES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType, type,
             types.ModuleType, staticmethod, classmethod, property, types.MethodDescriptorType,
             types.WrapperDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType,
             types.ClassMethodDescriptorType)


Entry = tuple  # (namespace, name, object, code, defaults, kwdefaults, label): one watched name


def take(pinned: dict[str, Any] | None = None) -> tuple[Entry, ...]:
    """The seal of this process as it is now; `pinned` names objects whose own attributes are watched too. A tuple:
    nothing can be removed from it later."""
    record = _Recorder()
    for name in sorted(n for n in sys.modules if n == HARNESS or n.startswith(HARNESS + ".")):
        record.module(sys.modules[name], name)
    for name in WATCHED_MODULES:
        if name in sys.modules:
            record.module(sys.modules[name], name)
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = vars(torch.cuda)
        for name in TORCH_CUDA_NAMES:
            if name in cuda:
                record.entry(cuda, name, cuda[name], f"torch.cuda.{name}")
        for name in TORCH_MODULES:
            if name in sys.modules:
                record.module(sys.modules[name], name)
    for label, obj in (pinned or {}).items():
        for attr, value in vars(obj).items():
            if isinstance(value, CALLABLES) or type(value).__module__ in ("torch.cuda.streams", __name__):
                record.entry(vars(obj), attr, value, f"{label}.{attr}")
    return tuple(record.entries)


def broken(entries: tuple[Entry, ...]) -> list[str]:
    """Each watched name that is no longer what was recorded (empty while the seal holds). Only dictionary reads
    and identity tests: no name it looks up can have been replaced to blind it."""
    out: list[str] = []
    for namespace, name, obj, code, defaults, kwdefaults, label in entries:
        now = namespace.get(name, MISSING)
        if now is not obj:
            out.append(label if now is not MISSING else f"{label} (deleted)")
        elif code is not None and (obj.__code__ is not code or obj.__defaults__ is not defaults
                                   or obj.__kwdefaults__ is not kwdefaults):
            out.append(f"{label} (its code)")
    return out


# ---------------------------------------------------------------- recording


class _Recorder:
    """Walks modules, classes and pinned objects into entries, each namespace and each class once."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.classes: set[int] = set()

    def module(self, module: types.ModuleType, label: str) -> None:
        namespace = vars(module)
        for name, value in list(namespace.items()):
            if name.startswith("__") and name.endswith("__"):
                continue
            if isinstance(value, dict) and value and all(isinstance(v, FUNCTIONS) for v in value.values()):
                for key, function in value.items():  # a dispatch table: side.COMMANDS
                    self.entry(value, key, function, f"{label}.{name}[{key!r}]")
            elif isinstance(value, CALLABLES):
                self.entry(namespace, name, value, f"{label}.{name}",
                           walk=not isinstance(value, type) or value.__module__ == module.__name__)

    def entry(self, namespace: Any, name: str, value: Any, label: str, walk: bool = True) -> None:
        """One watched name; a class's own methods too (when `walk`), once per class."""
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        if function is not value:  # a wrapper: the wrapper's identity here, the wrapped function's code below
            self.entries.append((namespace, name, value, None, None, None, label))
            namespace, name, value = {"f": function}, "f", function
        if isinstance(value, FUNCTIONS):
            self.entries.append((namespace, name, value, value.__code__, value.__defaults__, value.__kwdefaults__,
                                 label))
            return
        self.entries.append((namespace, name, value, None, None, None, label))
        if walk and isinstance(value, type):
            self.cls(value, label)

    def cls(self, cls: type, label: str) -> None:
        if cls.__flags__ & IMMUTABLE_TYPE or id(cls) in self.classes:  # int, dict, torch's C types: nothing can
            return  # be set on them; a class reached twice (torch.cuda.Event, torch.cuda.streams.Event) is walked once
        self.classes.add(id(cls))
        namespace = cls.__dict__  # a live view: a method set on the class later shows here
        for name, value in list(namespace.items()):
            if name not in ("__dict__", "__weakref__", "__doc__", "__module__", "__annotations__") and \
                    isinstance(value, CALLABLES):
                self.entry(namespace, name, value, f"{label}.{name}", walk=False)


class Clock:
    """What the timed window calls once the side's call has returned, taken from torch's C extension at the seal:
    no Python code can replace these, and the side reads them into its frame before the call."""

    def __init__(self, torch: Any) -> None:
        import time

        self.event_type = torch._C._CudaEventBase
        self.stream = torch.cuda.current_stream()  # the side's stream: its calls run here (the stream check)
        self.record = self.event_type.record
        self.query = self.event_type.query
        self.elapsed_ms = self.event_type.elapsed_time
        self.synchronize = torch._C._cuda_synchronize
        self.sleep = torch._C._cuda_sleep
        self.now = time.perf_counter


# ---------------------------------------------------------------- Python's own hooks

HOOK_EVENTS = frozenset(("sys.settrace", "sys.setprofile", "sys._settraceallthreads", "sys._setprofileallthreads",
                         "sys.monitoring.register_callback"))
MONITORING_TOOLS = range(6)  # sys.monitoring's tool ids, 0-5


class HookRefused(RuntimeError):
    """Raised into task code that asks for a trace, profile or monitoring hook in a side process."""


class HookWatch:
    """Refuses trace, profile and monitoring hooks in this process from now on (an audit hook: it cannot be removed
    from Python) and, in `set`, names each one attempted or found in place since. Everything `set` calls is bound
    here, before any task code runs; `codes` are the harness functions whose frames carry a reply (their
    sys.monitoring local events are watched)."""

    def __init__(self, codes: tuple = ()) -> None:
        import threading

        self.attempts: list[str] = []
        events, attempts, refused = HOOK_EVENTS, self.attempts, HookRefused

        def refuse(event: str, args: tuple) -> None:
            if event in events:
                attempts.append(event)
                raise refused(f"{event} is refused in a harness side process (a hook there could edit the reply)")

        monitoring = getattr(sys, "monitoring", None)
        self.reads = (sys.gettrace, sys.getprofile, sys._getframe, vars(threading), monitoring, tuple(codes))
        self.before = (sys.gettrace(), sys.getprofile(), threading.__dict__.get("_trace_hook"),
                       threading.__dict__.get("_profile_hook"),
                       tuple(_monitored(monitoring, t, codes) for t in MONITORING_TOOLS) if monitoring else ())
        sys.addaudithook(refuse)

    def set(self) -> list[str]:
        """Each hook attempted (refused) or found set since the watch began; empty while there is none."""
        gettrace, getprofile, getframe, threading_names, monitoring, codes = self.reads
        trace, profile, thread_trace, thread_profile, tools = self.before
        out = [f"{event} (refused)" for event in dict.fromkeys(self.attempts)]
        if gettrace() is not trace:
            out.append("sys.settrace (a trace function is set)")
        if getprofile() is not profile:
            out.append("sys.setprofile (a profile function is set)")
        if threading_names.get("_trace_hook") is not thread_trace:
            out.append("threading.settrace")
        if threading_names.get("_profile_hook") is not thread_profile:
            out.append("threading.setprofile")
        frame = getframe(1)
        while frame is not None:
            if frame.f_trace is not None:
                out.append(f"a trace function on the harness's frame {frame.f_code.co_name}()")
            frame = frame.f_back
        if monitoring is not None:
            out += [f"sys.monitoring tool {tool}" for tool in MONITORING_TOOLS
                    if _monitored(monitoring, tool, codes) != tools[tool]]
        return out


def _monitored(monitoring: Any, tool: int, codes: tuple) -> tuple:
    """What sys.monitoring (Python 3.12+) holds for one tool id: its name, its events, its local events on `codes`;
    ("unreadable",) where this Python refuses to say (a change from that still shows)."""
    try:
        return (monitoring.get_tool(tool), monitoring.get_events(tool),
                tuple(monitoring.get_local_events(tool, code) for code in codes))
    except ValueError:
        return ("unreadable",)
