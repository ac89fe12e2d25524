"""Where what people see goes: the two consoles (stdout, and stderr for errors and waiting lines), plain output on
request, an error on lines of its own with its command whole, and the transient line of what a command waits for.

Every view prints through `terminal.console` / `terminal.errors`, read at the time of printing: plain_output()
replaces both (--no-color)."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional, Union

from rich.console import Console, ConsoleOptions
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.text import Text



class StdoutConsole(Console):
    """stdout's console: a reader that left (`inv status | head -1`) ends the command as every print to stdout does
    (commandline.py: quietly, exit 141), not with rich's own exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


console = StdoutConsole()
errors = Console(stderr=True)


def error_line(message: str) -> None:
    """An error in one line, never wrapped: it may name a run, a path or the command that helps."""
    errors.print(Text(strip_control_codes(f"error: {message}"), style="bold red"), soft_wrap=True)


def say(text: str, style: Optional[str] = None, stderr: bool = False) -> None:
    """A line that names what people and agents copy (a run id, a path, a command): printed whole, never wrapped with
    a real newline, piped or not, at any width (a terminal may fold it on screen; a copy of it is still one line)."""
    (errors if stderr else console).print(Text(strip_control_codes(text), style=style or ""), soft_wrap=True)


class Unbroken:
    """A line printed whole, never wrapped or cut, however narrow the terminal (the terminal may fold it; a copy of it
    is still one command): a `trust-host` command, for one. Print views holding one with show()."""

    def __init__(self, text: Union[str, Text], style: Optional[str] = None) -> None:
        self.text = text.copy() if isinstance(text, Text) else Text(strip_control_codes(text))
        if isinstance(text, Text):
            self.text.plain = strip_control_codes(self.text.plain)
        if style:
            self.text.stylize(style)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        yield from self.text.render(console)
        yield Segment.line()


COMMAND_FOLLOWS = ": inv "  # "... accept it with: inv trust-host --host h --fingerprint SHA256:..."


def error_lines(message: str, indent: str = "") -> list[Any]:
    """An error on lines of its own: its words wrapped to the width, and a command it ends with on a line of its own,
    whole."""
    head, found, command = message.rpartition(COMMAND_FOLLOWS)
    if not found:
        return [Text.assemble(indent, (message, "red"))]
    return [Text.assemble(indent, (head + ":", "red")), Unbroken(f"{indent}  inv {command}", "bold")]


def show(renderable: Any) -> None:
    """Print a view; its Unbroken lines stay whole (nothing is cropped at the width: everything else fits it)."""
    console.print(renderable, crop=False)


class Waiting:
    """What a command waits for, on one transient line on stderr while it waits (only on a terminal: piped output and
    logs stay clean): `gpu-status: waiting for ion8-h200, ion9-h200 (1 of 3 answered)`."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._status = None

    def __enter__(self) -> "Waiting":
        if errors.is_terminal:
            self._status = errors.status(self.what)
            self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)

    def say(self, text: str) -> None:
        if self._status is not None:
            self._status.update(f"{self.what}: {text}")

    def hosts(self, total: int) -> Callable[[list[str]], None]:
        """A waiting_for(names) for fanout.on_every_host."""
        def update(pending: list[str]) -> None:
            if pending:
                self.say(f"waiting for {', '.join(pending)} ({total - len(pending)} of {total} answered)")
        return update


def plain_output() -> None:
    """--no-color: plain text, no escape codes at all, on both consoles (NO_COLOR in the environment takes the colors
    away and keeps bold and dim, as no-color.org asks)."""
    global console, errors
    console = StdoutConsole(color_system=None)
    errors = Console(stderr=True, color_system=None)

