"""The `kpremote` command: Invoke's Program over the same tasks as `inv`, usable from any folder of a project, with
`--version` printing kpremote's and shell completion that knows hosts, groups, tasks and run ids.

    kpremote --print-completion-script bash > ~/.local/share/bash-completion/completions/kpremote
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Iterable, Optional

from invoke import Program
from invoke.exceptions import Exit

from . import __version__

# The flags whose values completion offers, and where they come from.
VALUE_FLAGS = ("--host", "--task", "--run", "--base", "--new")


class KpremoteProgram(Program):
    """Program with value completion: after --host, the hosts and groups of hosts.toml; after --task, the project's
    tasks; after --run (and compare's --base/--new), `latest` and the run ids fetched so far. Everything else is
    Invoke's own completion (task names, flags)."""

    def parse_cleanup(self) -> None:
        if self.args.complete.value:
            values = complete_value(self.core.remainder, self.binary_names)
            if values is not None:
                for value in values:
                    print(value)
                raise Exit
        super().parse_cleanup()


def complete_value(remainder: str, names: Iterable[str]) -> Optional[list[str]]:
    """The values to offer when the word being completed is a value of one of VALUE_FLAGS; None otherwise."""
    try:
        tokens = shlex.split(remainder)
    except ValueError:
        return None
    tokens = [t for t in tokens if t not in names]
    if tokens and tokens[-1] in VALUE_FLAGS:
        flag = tokens[-1]  # `--host <TAB>`: nothing typed yet
    elif len(tokens) >= 2 and tokens[-2] in VALUE_FLAGS and not tokens[-1].startswith("-"):
        flag = tokens[-2]  # `--host io<TAB>`: the shell keeps what matches
    else:
        return None
    return values_for(flag)


def values_for(flag: str) -> list[str]:
    from .project import default_hosts_file, kernels_dir

    if flag == "--host":
        return host_names(default_hosts_file())
    kernels = kernels_dir()
    if flag == "--task":
        return sorted(p.parent.name for p in kernels.glob("*/task.toml"))
    fetched = {p.name for p in kernels.glob("*/results/*/*") if p.is_dir() and p.parent.name != "check"}
    return ["latest", *sorted(fetched, reverse=True)]


def host_names(path: Path) -> list[str]:
    from .config import load_inventory
    from .errors import KpremoteError

    try:
        inventory = load_inventory(path)
    except KpremoteError:
        return []
    hosts = [h.name for h in inventory.select(None)]
    groups = sorted({g for h in inventory.select(None) for g in h.groups})
    return hosts + [g for g in groups if g not in hosts]


def make_program() -> KpremoteProgram:
    from .commands import ns

    return KpremoteProgram(namespace=ns, version=__version__, name="kpremote", binary="kpremote",
                           binary_names=["kpremote"])


def main() -> None:
    from .interrupt import install_early

    install_early()  # Ctrl-C before Invoke has loaded the commands: 130, not Invoke's silent 1
    make_program().run(spelled_as_one_task(sys.argv))


def spelled_as_one_task(argv: list[str]) -> list[str]:
    """`kpremote skill install ...` is the task `skill-install` (Invoke would read two tasks)."""
    if argv[1:3] == ["skill", "install"]:
        return [argv[0], "skill-install", *argv[3:]]
    return argv


if __name__ == "__main__":
    main()
