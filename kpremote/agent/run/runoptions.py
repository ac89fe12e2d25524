"""The runners' command lines: the timing runner's options, and the profile runner's request on top of them.

    python -m kpremote.agent.run.runner --task-dir W --run-dir R --device cuda|cpu|auto [--gpu UUID] [--lease-fd N]
        [--workloads a,b] [--mode cold|graph] [--host-alias NAME] [--root ROOT] [--audit on|off]
    python -m kpremote.agent.run.profile --profile JSON [the same options]
        (what `start --profile JSON` spawns; JSON is a protocol.ProfileRequest)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..protocol import ProfileRequest

TIMING_PROG = "python -m kpremote.agent.run.runner"
PROFILE_PROG = "python -m kpremote.agent.run.profile"
DESCRIPTION = "One run, start to end: validate → lease → build → (correctness → timing) per workload → report."


@dataclass
class Options:
    task_dir: Path
    run_dir: Path
    device: str = "auto"
    gpu: str | None = None
    lease_fd: int | None = None
    workloads: list[str] | None = None
    mode: str | None = None
    host_alias: str | None = None
    root: Path | None = None
    audit: str | None = None  # "on" | "off"; None: on for a GPU run


def parse_args(argv: list[str], prog: str = TIMING_PROG) -> Options:
    args = _parser(prog).parse_args(argv)
    return Options(
        task_dir=args.task_dir.resolve(),
        run_dir=args.run_dir.resolve(),
        device=args.device,
        gpu=args.gpu,
        lease_fd=args.lease_fd,
        workloads=[w.strip() for w in args.workloads.split(",") if w.strip()] if args.workloads else None,
        mode=args.mode,
        host_alias=args.host_alias,
        root=args.root,
        audit=args.audit,
    )


def parse_profile_args(argv: list[str]) -> tuple[ProfileRequest | str, Options]:
    """The runner's options and the profile request; a request that cannot be read comes back as a string saying
    why (the profile runner refuses it with a run record, as it refuses a bad task)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--profile", required=True)
    known, rest = parser.parse_known_args(argv)
    options = parse_args(rest, PROFILE_PROG)
    try:
        return ProfileRequest.from_json(known.profile), options
    except ValueError as exc:
        return str(exc), options


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("--task-dir", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu", "auto"), default="auto")
    parser.add_argument("--gpu", help="GPU UUID (or index) to use")
    parser.add_argument("--lease-fd", type=int, help="an inherited, already locked lease file descriptor")
    parser.add_argument("--workloads", help="comma-separated workload ids (default: all)")
    parser.add_argument("--mode", choices=("cold", "graph"))
    parser.add_argument("--host-alias")
    parser.add_argument("--root", type=Path, help="kpremote root holding locks/ (default: $KPREMOTE_ROOT)")
    parser.add_argument("--audit", choices=("on", "off"),
                        help="re-measure production rows with Nsight Compute after the run (default: on for cuda)")
    return parser
