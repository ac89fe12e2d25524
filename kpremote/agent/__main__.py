"""`python -m kpremote.agent SUBCOMMAND ...`: the agent's command line, the one seam the client talks to.

Every subcommand prints JSON on stdout (one object, or JSON lines for follow; a tar for pack-summary) and human
text on stderr. Expected failures are one line of JSON {"error": kind, "message": ...} and a non-zero exit code,
never a traceback. Every subcommand accepts --root (BOOT appends it); `run` and `sync-apply` belong to
runner.py and sync.py and get their arguments untouched.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from .protocol import AgentError, ExitCode, ProbedGpu, UsageError

DELEGATED = {"run": "kpremote.agent.run.runner", "sync-apply": "kpremote.agent.sync"}
BINARY_STDOUT = {"pack-summary"}  # errors of these go to stderr only: stdout carries data, not JSON


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(DELEGATED[argv[0]], argv[1:])
    subcommand = argv[0] if argv else ""
    try:
        args = _parser(subcommand).parse_args(argv)
        return args.handler(args)
    except UsageError as exc:
        return _fail(exc.kind, str(exc), exc.exit_code, subcommand)
    except BrokenPipeError:
        return _quiet_after_client_left()
    except AgentError as exc:
        return _fail(exc.kind, str(exc), exc.exit_code, subcommand)
    except OSError as exc:
        from .run.runstate import disk_full_message, is_disk_full

        if not is_disk_full(exc):
            raise
        return _fail("disk_full", disk_full_message(exc.filename or _root_in(argv)), ExitCode.ERROR, subcommand)


def _root_in(argv: list[str]) -> Path:
    root = argv[argv.index("--root") + 1] if "--root" in argv[:-1] else os.environ.get("KPREMOTE_ROOT", "~/kpremote")
    return Path(os.path.expanduser(root))


def _delegate(module_name: str, argv: list[str]) -> int:
    module = importlib.import_module(module_name)
    return int(module.main(argv) or 0)


def _fail(kind: str, message: str, exit_code: int, subcommand: str) -> int:
    sys.stderr.write(f"kpremote agent {subcommand}: {message}\n")
    if subcommand not in BINARY_STDOUT:
        try:
            _print_json({"error": kind, "message": message})
        except BrokenPipeError:  # the client is gone (a start that stopped because of it, say): the code says it
            _quiet_after_client_left()
    return exit_code


def _quiet_after_client_left() -> int:
    # Point stdout at /dev/null so the interpreter's final flush does not complain about the closed pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------ parser


def _parser(asked: str = "") -> argparse.ArgumentParser:
    """The agent's command line with only the asked subcommand's parser built (each call runs one: building all
    of them is CPU on every host for every query); every one of them when the name is none of theirs, so --help and
    an unknown name list them all."""
    parser = _Parser(prog="kpremote-agent", description="kpremote agent (runs on the GPU host)")
    sub = parser.add_subparsers(dest="subcommand", required=True, parser_class=_Parser)
    built = []

    def command(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        if asked and name != asked:
            return _UNBUILT  # type: ignore[return-value]
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--root", default=os.environ.get("KPREMOTE_ROOT", "~/kpremote"))
        p.set_defaults(handler=handler)
        built.append(name)
        return p

    p = command("info", _info, "versions of python, torch, triton, nvidia-ml-py, apache-tvm-ffi, nvidia-cutlass-dsl, CUDA")
    p.add_argument("--fast", action="store_true", help="do not import torch (cuda_available is then null)")

    p = command("probe", _probe, "GPU snapshot with idle verdict, lease holder and arch fit per GPU")
    p.add_argument("--idle", default=None, help="idle policy JSON")
    p.add_argument("--arch", default="any")

    p = command("start", _start, "lease a GPU and start a run detached")
    p.add_argument("--task", required=True)
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--gpu", default=None, help="GPU index or UUID")
    p.add_argument("--idle", default=None, help="idle policy JSON")
    p.add_argument("--arch", default="any")
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait for an idle GPU")
    p.add_argument("--no-lease", action="store_true")
    p.add_argument("--workloads", default=None)
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--mode", default=None, help="a timing run's mode (cold or graph)")
    kind.add_argument("--profile", default=None, help="a profile run: the ProfileRequest as JSON")
    p.add_argument("--audit", choices=("on", "off"), default=None, help="the runner's Nsight Compute audit")
    p.add_argument("--host-alias", default=None)
    p.add_argument("--sync", action="store_true", help="apply a sync stream from stdin first")
    p.add_argument("--run-id", default=None, help="the run id the client chose (so it can cancel before it hears back)")
    p.add_argument("--progress", action="store_true",
                   help="JSON lines: created, waiting (what the wait is for), then the answer")

    p = command("follow", _follow, "stream a run's events until it ends")
    _run_arguments(p)
    p.add_argument("--from", dest="offset", type=int, default=0)
    p.add_argument("--once", action="store_true", help="send the events there now and the current state, then end")
    p.add_argument("--with-summary", action="store_true",
                   help="after the end line of a finished run (not a cancelled one), its summary tar, as pack-summary")

    p = command("status", _status, "state of the runs on this host")
    p.add_argument("--task", default=None)

    p = command("cancel", _cancel, "stop a run and its whole process group (or its start, while it waits)")
    _run_arguments(p)
    p.add_argument("--pending", action="store_true",
                   help="if the run does not exist yet, make sure its start never begins it")
    p.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL")
    _run_arguments(command("pack-summary", _pack_summary, "tar of a finished run's summary/ on stdout"))

    p = command("raw-file", _raw_file, "one named file of a finished run's raw/ on stdout (--stat: JSON about it)")
    _run_arguments(p)
    p.add_argument("--name", required=True, help="a path under raw/, e.g. ncu/baseline-W.ncu-rep")
    p.add_argument("--stat", action="store_true", help="print {name, path, bytes, sha256} instead of the bytes")

    p = command("ship", _ship, "extract an agent tar from stdin into DEST")
    p.add_argument("--dest", required=True)

    if not (asked and built) or asked.startswith("slurm-"):  # slurm-*: Slurm clusters (issue 15, docs/slurm.md)
        from .slurm.commands import add_commands as add_slurm_commands

        add_slurm_commands(command)
    return parser if asked == "" or built else _parser()


class _Unbuilt:
    """The parser of a subcommand that was not asked for this time: takes its arguments and keeps none."""

    def add_argument(self, *args: Any, **kwargs: Any) -> None:
        return None

    def add_mutually_exclusive_group(self, *args: Any, **kwargs: Any) -> _Unbuilt:
        return self


_UNBUILT = _Unbuilt()


def _run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True)
    p.add_argument("--run", required=True)


def _root(args: argparse.Namespace) -> Path:
    return Path(os.path.expanduser(args.root))


# ------------------------------------------------------------------------------------------ handlers


def _info(args: argparse.Namespace) -> int:
    import platform
    import socket

    _print_json(
        {
            "hostname": socket.gethostname(),
            "python": platform.python_version(),
            "torch": _version("torch"),
            "triton": _version("triton"),
            "pynvml": _version("nvidia-ml-py"),
            "tvm_ffi": _version("apache-tvm-ffi"),  # the packages the tvm-ffi and cutedsl build kinds need
            "cutlass_dsl": _version("nvidia-cutlass-dsl"),
            "sandbox": _sandbox(),
            **(_torch_cuda_unimported() if args.fast else _torch_cuda()),
        }
    )
    return 0


def _sandbox() -> str:
    """What a run's sides would be held by here, in words: "sandboxed", or the level and what is missing."""
    from . import sandbox

    support = sandbox.support()
    return support.level if support.level == "sandboxed" else f"{support.level}: {'; '.join(support.why_not)}"


def _version(distribution: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_cuda() -> dict[str, Any]:
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken torch install is reported as no torch, not a crash
        return {"cuda": None, "cuda_available": False}
    return {"cuda": torch.version.cuda, "cuda_available": bool(torch.cuda.is_available())}


def _torch_cuda_unimported() -> dict[str, Any]:
    from .run.startchecks import torch_cuda_build

    return {"cuda": torch_cuda_build(), "cuda_available": None}


def _probe(args: argparse.Namespace) -> int:
    from .lease import IdlePolicy, arch_refusal, describe_holder, holders, idle_verdict, task_arches
    from .nvml import snapshot

    policy = IdlePolicy.from_json(args.idle)
    arch = task_arches(args.arch)
    snap = snapshot()
    held = holders(_root(args)) if snap.gpus else {}
    report = snap.to_json()
    report["gpus"] = []
    for gpu in snap.gpus:
        # idle means "a run would lease it now": idle by the policy and nobody's lease on it.
        idle, reason = idle_verdict(gpu, policy)
        lease = held.get(gpu.uuid)
        if lease is not None:
            idle, reason = False, "leased: " + describe_holder(lease) + ("" if idle else f"; {reason}")
        refusal = arch_refusal(arch, gpu)
        report["gpus"].append(ProbedGpu(**vars(gpu), lease=lease, idle=idle, reason=reason, arch_ok=refusal is None,
                                        arch_reason=refusal).to_json())
    _print_json(report)
    return 0


def _start(args: argparse.Namespace) -> int:
    from .lease import IdlePolicy
    from .run.start import start
    from .run.startchecks import StartRequest
    from .sync import sync_answer

    request = StartRequest(
        task=args.task,
        device=args.device,
        gpu=args.gpu,
        policy=IdlePolicy.from_json(args.idle),
        arch=args.arch,
        wait_s=args.wait,
        lease=not args.no_lease,
        workloads=args.workloads,
        mode=args.mode,
        host_alias=args.host_alias,
        profile=args.profile,
        run_id=args.run_id,
        audit=args.audit,
    )
    synced = sync_answer(_root(args), args.task, sys.stdin.buffer) if args.sync else None
    if synced is not None and "error" in synced:
        _print_json(synced)
        return int(synced.get("exit_code", ExitCode.ERROR))
    if synced is not None and synced.get("need_full"):
        # The workspace is not what the client remembered: never start on it. The client re-syncs from this
        # listing and calls start again.
        _print_json(synced)
        return ExitCode.NEED_FULL_SYNC
    result = start(_root(args), request, announce=_print_json if args.progress else None)
    answer = {**result, "sync": synced} if synced is not None else result
    _print_json({"event": "started", **answer} if args.progress else answer)
    return 0


def _follow(args: argparse.Namespace) -> int:
    from .run.follow import follow

    return follow(_root(args), args.task, args.run, args.offset, once=args.once, with_summary=args.with_summary)


def _status(args: argparse.Namespace) -> int:
    from .run.liveness import status

    _print_json(status(_root(args), args.task))
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from .run.cancel import cancel

    grace = {} if args.grace is None else {"grace_s": max(0.0, args.grace)}
    _print_json(cancel(_root(args), args.task, args.run, pending=args.pending, **grace))
    return 0


def _pack_summary(args: argparse.Namespace) -> int:
    from .run.summary import pack_summary

    pack_summary(_root(args), args.task, args.run, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


def _raw_file(args: argparse.Namespace) -> int:
    from .run.rawfiles import raw_file_stat, send_raw_file

    if args.stat:
        _print_json(raw_file_stat(_root(args), args.task, args.run, args.name))
    else:
        send_raw_file(_root(args), args.task, args.run, args.name, sys.stdout.buffer)
    return 0


def _ship(args: argparse.Namespace) -> int:
    import tarfile

    from .boot import ship
    from .lease import BadRequest

    dest = os.path.expanduser(args.dest)
    try:
        ship(dest, sys.stdin.buffer)
    except (ValueError, tarfile.TarError) as exc:
        raise BadRequest(str(exc)) from None
    _print_json({"ok": True, "dest": dest})
    return 0


if __name__ == "__main__":
    sys.exit(main())
