"""Glue shared by the Invoke tasks: one-line errors (and, under --json, one kpremote.error/1 document), exit codes,
--json output."""

from __future__ import annotations

import functools
import json
import shlex
import sys
from typing import TYPE_CHECKING, Any, Callable

from invoke import Task, task
from invoke.exceptions import Exit

from ..runs import interrupt
from ..errors import KpremoteError, StoppedByUser
from .jsonout import json_asked, print_error
from .pipes import stdout_reader_gone
from ..views import terminal
from ..views.terminal import error_line

if TYPE_CHECKING:  # annotations only
    from ..hosts.config import Inventory

EXIT_FAILED = 1      # the command ran and something it checked failed (a host down, a row not PASSED)
EXIT_USAGE = 2       # bad input: hosts.toml, an unknown host/task, a refused key; a host that could not be asked
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 141  # stdout's reader left before the command was done (`| head`): 128 + SIGPIPE, as a shell has it


class FlagTask(Task):
    """A task whose chosen flags also have a one-letter form (gpu-status -p -u -a, as gpustat has)."""

    def __init__(self, *args: Any, short_flags: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.short_flags = short_flags or {}

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in self.short_flags:
            opts["names"].append(self.short_flags[name])
        return opts


def command(help: dict[str, str] | None = None, short: dict[str, str] | None = None, **task_kwargs: Any) -> Callable:
    """@task with kpremote's error contract: KpremoteError → one line on stderr, exit 2; Ctrl-C → whatever the
    command started on hosts is cancelled (interrupt.py), exit 130; `inv --dry` → what would run, nothing run.
    short: {parameter: letter} for the flags that also have a one-letter form."""

    def decorate(fn: Callable) -> Any:
        @functools.wraps(fn)
        def wrapper(c, *args: Any, **kwargs: Any) -> Any:
            if _dry(c):
                say(f"dry run, nothing was run: {_as_command_line(fn.__name__, kwargs)}")
                return None
            interrupt.install(say)
            if isinstance(kwargs.get("task"), str):
                kwargs["task"] = as_typed(kwargs["task"])
            try:
                return fn(c, *args, **kwargs)
            except KpremoteError as exc:
                error_line(str(exc))
                if json_asked(kwargs):  # --json promises one document: the refusal is that document
                    print_error(fn.__name__.replace("_", "-"), str(exc), EXIT_USAGE)
                raise Exit(code=EXIT_USAGE) from None
            except BrokenPipeError:  # `inv status | head -1`: stdout's reader left; what runs on a host goes on
                stdout_reader_gone()
                raise Exit(code=EXIT_READER_GONE) from None
            except KeyboardInterrupt as exc:
                interrupt.cancel_registered(say)
                if isinstance(exc, StoppedByUser):
                    say(exc.line)
                else:
                    error_line("interrupted")
                # never through Python's own exit, which may wait on a thread or end -2 (leave_now says why)
                interrupt.leave_now(EXIT_INTERRUPTED)

        return task(wrapper, help=help or {}, auto_shortflags=False, klass=FlagTask, short_flags=short, **task_kwargs)

    return decorate


def as_typed(tasks: str) -> str:
    """--task as a shell completes it: `my_task/` (a folder's name, completed in kernels/) and `kernels/my_task/`
    (completed from the project's root) name my_task."""
    return ",".join(_folder_name(name) for name in tasks.split(","))


def _folder_name(name: str) -> str:
    name = name[:-1] if name.endswith("/") else name
    return name[len("kernels/"):] if name.startswith("kernels/") and name.count("/") == 1 else name


def say(line: str) -> None:
    """A line for the person at the terminal (stderr: stdout may be JSON for a script)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _dry(c: Any) -> bool:
    try:
        return bool(c.config.run.dry)
    except AttributeError:
        return False


def _as_command_line(name: str, kwargs: dict[str, Any]) -> str:
    words = ["inv", name.replace("_", "-")]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value not in (None, False, ""):
            words += [flag, shlex.quote(str(value))]
    return " ".join(words)


def print_json(payload: Any) -> None:
    sys.stdout.write((payload if isinstance(payload, str) else json.dumps(payload, indent=1, default=str)) + "\n")
    sys.stdout.flush()


def finish(ok: bool, code: int = EXIT_FAILED) -> None:
    if not ok:
        raise Exit(code=code)


def finish_asking(answered: list[bool], ok: list[bool]) -> None:
    """The exit of a command that asks every host (gpu-status, status, hosts --check): 2 when a host could not be
    asked (unreachable, its key refused, no agent there: as run, sync and logs exit), else 1 when one answered with
    a failure (NVML missing, say), else 0."""
    finish(all(answered), EXIT_USAGE)
    finish(all(ok))


def finish_asking_hosts(inventory: "Inventory", host: str | None, answered: list[bool], ok: list[bool]) -> None:
    """finish_asking, and when hosts picked by default (no --host, no --hosts FILE, no $KPREMOTE_HOSTS) could not be
    asked, where they came from and what to do."""
    if not (host or inventory.chosen) and not all(answered):
        own = "" if inventory.layers else (", or list your own in ~/.config/kpremote/hosts.toml (it layers over "
                                           "the project's)")
        terminal.say(f"hint: {answered.count(False)} of {len(answered)} hosts could not be asked; they are those of "
                     f"{inventory.files}: pick one with --host NAME{own}", stderr=True)
    finish_asking(answered, ok)
