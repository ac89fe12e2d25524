"""The `kpremote` command: Invoke's Program over the same tasks as `inv`, usable from any folder of a project, with
`--version` printing kpremote's and shell completion that knows hosts, groups, tasks and run ids.

    kpremote --print-completion-script bash > ~/.local/share/bash-completion/completions/kpremote

Both `kpremote` and `inv` (through tasks.py) parse with kpremote's contract: a command line Invoke cannot parse (a
required option missing, an unknown option, an option without its value) is one line in kpremote's words, exit 2,
and `COMMAND --help` is that command's help, never the value of a required option.
"""

from __future__ import annotations

import difflib
import functools
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from invoke import Program
from invoke.exceptions import Exit, ParseError

from . import __version__
from .cli.jsonout import json_asked, print_error
from .cli.pipes import flush_at_exit, stdout_reader_gone

# The flags whose values completion offers, and where they come from.
VALUE_FLAGS = ("--host", "--task", "--run", "--base", "--new")


HELP_WORDS = ("--help", "-h")
NO_IDEA = re.compile(r"^No idea what '(.*)' is!$")
FLAG_MESSAGE = re.compile(r"^Flag <Argument: ([\w-]+)[^>]*> (needed value and was not given one|doesn't take any value)!$")


def usage_line(exc: ParseError, program: str, commands: Iterable[str]) -> str:
    """Invoke's parse error in kpremote's words, naming the command, the option and where to read more."""
    context = exc.context if exc.context is not None and exc.context.name else None
    name = context.name if context is not None else None
    help_hint = f" (see: {program} --help {name})" if name else f" (see: {program} --list)"
    message = str(exc)
    unknown = NO_IDEA.match(message)
    flag = FLAG_MESSAGE.match(message)
    if flag and flag.group(2).startswith("needed"):
        return f"error: {name or program}: {_flag(flag.group(1))} needs a value{help_hint}"
    if flag:
        return f"error: {name or program}: {_flag(flag.group(1))} takes no value{help_hint}"
    if unknown and name and unknown.group(1).startswith("-"):  # before a missing option: `--taks X` misspells it
        word = unknown.group(1)
        return f"error: {name}: unknown option {word}{_closest(word, context.flags)}{help_hint}"
    if context is not None and context.missing_positional_args:
        missing = ", ".join(_flag(arg.name) + " VALUE" for arg in context.missing_positional_args)
        return f"error: {name}: {missing} is required{help_hint}"
    if unknown and name:
        return f"error: {name}: unexpected {unknown.group(1)!r}: every value follows its option (--name VALUE){help_hint}"
    if unknown and unknown.group(1).startswith("-"):
        return f"error: unknown option {unknown.group(1)} (see: {program} --help)"
    if unknown:
        return f"error: unknown command {unknown.group(1)!r}{_closest(unknown.group(1), commands)}{help_hint}"
    return f"error: {message}{help_hint}"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _closest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" — did you mean {close[0]}?" if close else ""


def help_asked(tokens: list[str], commands: Iterable[str]) -> Optional[str]:
    """The command whose --help (or -h) is among tokens, given after the command's name; None if none is."""
    command = next((token for token in tokens if token in set(commands)), None)
    if command is None:
        return None
    after = tokens[tokens.index(command) + 1:]
    return command if any(token in HELP_WORDS for token in after) else None


def kpremote_parsing(step: Callable[[Any], None]) -> Callable[[Any], None]:
    """Program.parse_tasks / parse_cleanup with kpremote's contract (the module docstring)."""
    if getattr(step, "kpremote_parsing", False):
        return step

    @functools.wraps(step)
    def parse(self: Program) -> None:
        commands = list(self.collection.task_names) if self.collection is not None else []
        asked = help_asked(self.core.unparsed, commands) if step.__name__ == "parse_tasks" else None
        if asked:  # `COMMAND --help`: Invoke would take --help as the value of COMMAND's first required option
            self.args.help.value = asked
            self.core.unparsed = []
        try:
            step(self)
        except BrokenPipeError:  # `inv --help run | head -1`: the reader had what it wanted
            stdout_reader_gone()
            raise Exit(code=0) from None
        except ParseError as exc:
            from .cli.commandline import EXIT_USAGE

            line = usage_line(exc, _program_name(self), commands)
            if json_asked(sys.argv[1:]):  # --json promises one document, even for a line that cannot be parsed
                command = exc.context.name if exc.context is not None and exc.context.name else _program_name(self)
                print_error(command, line.removeprefix("error: "), EXIT_USAGE)
            raise Exit(message=line, code=EXIT_USAGE) from None

    parse.kpremote_parsing = True  # type: ignore[attr-defined]
    return parse


def _program_name(program: Program) -> str:
    names = list(program.binary_names or [])
    return "inv" if "inv" in names or not names else names[0]


def use_kpremote_parsing(program: type = Program) -> None:
    """Give `inv` (Invoke's own Program, whose tasks.py is read before it parses a command's options) the parsing
    that `kpremote` has."""
    for name in ("parse_tasks", "parse_cleanup"):
        setattr(program, name, kpremote_parsing(getattr(program, name)))
    _no_option_as_a_value()
    import atexit

    atexit.register(flush_at_exit)


def _no_option_as_a_value() -> None:
    """Invoke gives a command's required option (--task) the next word it has no flag for, so `--taks X` made
    `--taks` the task and X the word it did not expect: a word that looks like an option is never such a value; it is
    an unknown option, named as one."""
    from invoke.parser.parser import ParseMachine

    see = ParseMachine.see_positional_arg
    if getattr(see, "kpremote_parsing", False):
        return

    def see_positional_arg(self: Any, value: Any) -> None:
        if isinstance(value, str) and value.startswith("-") and len(value) > 1:
            self.error(f"No idea what {value!r} is!")
        see(self, value)

    see_positional_arg.kpremote_parsing = True  # type: ignore[attr-defined]
    ParseMachine.see_positional_arg = see_positional_arg


SHOWN_CORE_OPTIONS = ("complete", "print-completion-script", "help", "list", "version", "dry", "debug")
"""The core options `kpremote --help` lists: Invoke's others (--pty, --prompt-for-sudo-password, ...) are about its
shell commands, which kpremote's commands never run."""


class KpremoteProgram(Program):
    """Program with value completion: after --host, the hosts and groups of hosts.toml; after --task, the project's
    tasks; after --run (and compare's --base/--new), `latest` and the run ids fetched so far. Everything else is
    Invoke's own completion (task names, flags)."""

    parse_tasks = kpremote_parsing(Program.parse_tasks)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _no_option_as_a_value()

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--core-opts] <command> [--command-opts] ...\n\nCore options:\n")
        self.print_columns([(spec, text) for spec, text in self.initial_context.help_tuples()
                            if re.search(r"--([\w-]+)", spec).group(1) in SHOWN_CORE_OPTIONS])
        self.list_tasks()

    @kpremote_parsing
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
    return values_for(flag, _value_of("--host", tokens[:-1] if tokens[-1] not in VALUE_FLAGS else tokens))


def _value_of(flag: str, tokens: list[str]) -> Optional[str]:
    """The value the command line gives flag (its last), if any."""
    values = [tokens[i + 1] for i, token in enumerate(tokens[:-1]) if token == flag]
    return values[-1] if values else None


def values_for(flag: str, host: Optional[str] = None) -> list[str]:
    from .project import default_hosts_file, kernels_dir

    if flag == "--host":
        return host_names(default_hosts_file())
    kernels = kernels_dir()
    if flag == "--task":
        return sorted(p.parent.name for p in kernels.glob("*/task.toml"))
    fetched = {p.name for p in kernels.glob("*/results/*/*") if p.is_dir() and p.parent.name != "check"
               and (host is None or p.parent.name == host)}  # --host H before --run: only H's runs
    return ["latest", *sorted(fetched, reverse=True)]


def host_names(path: Path) -> list[str]:
    from .hosts.config import load_inventory
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
    from .runs.interrupt import install_early

    install_early()  # Ctrl-C before Invoke has loaded the commands: 130, not Invoke's silent 1
    try:
        make_program().run(spelled_as_one_task(sys.argv))
    except BrokenPipeError:  # `kpremote --print-completion-script bash | head`: the reader had what it wanted
        stdout_reader_gone()
        sys.exit(0)
    finally:
        flush_at_exit()


def spelled_as_one_task(argv: list[str]) -> list[str]:
    """`kpremote skill install ...` is the task `skill-install` (Invoke would read two tasks)."""
    if argv[1:3] == ["skill", "install"]:
        return [argv[0], "skill-install", *argv[3:]]
    if argv[1:2] == ["skill"] and (len(argv) == 2 or argv[2] in HELP_WORDS):  # `kpremote skill --help`
        return [argv[0], "--help", "skill-install"]
    return argv


if __name__ == "__main__":
    main()
