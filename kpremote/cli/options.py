"""Every option value checked here, on the client, before anything connects.

A bad value is one line naming the option, what was given and what is allowed (KpremoteError: exit 2), and
nothing is created on any host. The task itself is read with the agent's own validator (taskspec.py, standard
library only), so a task.toml or a --workloads id that the host would refuse is refused here first, under the
path the user knows (kernels/<task>/...).
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional

from ..agent.protocol import TIMING_MODES
from ..errors import BadOption, KpremoteError
from ..task.taskdir import TaskDir

WAIT_FOREVER_S = 24 * 3600.0
MIN_WATCH_S = 0.5
DEVICES = ("auto", "cuda", "cpu")
GPU_UUID = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]+")


def seconds(option: str, value: Any, *, minimum: float = 0.0) -> float:
    """A finite number of seconds >= minimum."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BadOption(f"{option} {value!r}: give a number of seconds") from None
    if not math.isfinite(number) or number < minimum:
        raise BadOption(f"{option} {value!r}: give a number of seconds >= {minimum:g}")
    return number


def wait_seconds(value: Any) -> Optional[float]:
    """--wait: absent → no waiting; bare → a day; a number → at most that long."""
    if value in (None, False):
        return None
    if value is True or value == "":
        return WAIT_FOREVER_S
    return seconds("--wait", value) or None


def watch_seconds(value: Any) -> Optional[float]:
    """--watch: a refresh period of at least MIN_WATCH_S (a smaller one only burns the CPU)."""
    if value in (None, False, ""):
        return None
    return seconds("--watch", value, minimum=MIN_WATCH_S)


def whole_number(option: str, value: Any, *, minimum: int, maximum: int) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise BadOption(f"{option} {value!r}: give a whole number from {minimum} to {maximum}") from None
    if not minimum <= number <= maximum:
        raise BadOption(f"{option} {value!r}: give a whole number from {minimum} to {maximum}")
    return number


def choice(option: str, value: Optional[str], allowed: tuple[str, ...]) -> Optional[str]:
    if value is None:
        return None
    if value not in allowed:
        raise BadOption(f"{option} {value!r}: allowed: {', '.join(allowed)}")
    return value


def mode(value: Optional[str]) -> Optional[str]:
    return choice("--mode", value or None, TIMING_MODES)


def device(value: str) -> str:
    return choice("--device", value, DEVICES) or "auto"


def gpu(value: Any) -> Optional[str]:
    """--gpu: an index (0, 1, ...) or a UUID as nvidia-smi prints it (GPU-..., MIG-...)."""
    if value in (None, ""):
        return None
    text = str(value).strip()
    if text.isdigit() or GPU_UUID.fullmatch(text):
        return text
    raise BadOption(f"--gpu {value!r}: give a GPU index (0, 1, ...) or its UUID (GPU-...)")


def task_names(value: str) -> list[str]:
    """--task a,b: one or more task names; an empty item is a typo, not a request."""
    names = [name.strip() for name in str(value).split(",")]
    if not names or any(not name for name in names):
        raise BadOption(f"--task {value!r}: give task names separated by commas, with none empty")
    return names


def workload_ids(value: Optional[str]) -> Optional[list[str]]:
    if value is None or not str(value).strip():
        return None
    ids = [w.strip() for w in str(value).split(",")]
    if any(not w for w in ids):
        raise BadOption(f"--workloads {value!r}: give workload ids separated by commas, with none empty")
    return ids


def check_tasks(tasks: list[TaskDir], *, timing_mode: Optional[str], workloads: Optional[list[str]]) -> None:
    """Each task's task.toml and workloads.toml hold, and every --workloads id is one of its rows."""
    from ..agent.task import taskspec  # the host's own validator, so the client refuses exactly what the host would

    if taskspec.tomllib is None:  # Python 3.10 without tomli: the host checks the task instead
        return
    for task in tasks:
        try:
            taskspec.load_task(task.path, timing_mode=timing_mode, packages=False).select(workloads)
        except taskspec.TaskSpecError as exc:
            raise BadOption(f"{task.name}: {exc}") from None


EDITED_TASK_OPTION = "--edited-task"


def refuse_edited_tasks(tasks: list[TaskDir], *, edited_task: bool) -> None:
    """A task must be the one its pin holds (git's HEAD: docs/trust.md, "The sealed task") before anything is built:
    else one line naming each changed file. --edited-task runs it anyway, and the run says TASK EDITED."""
    from ..agent.provenance import committed_task, compare_to_pin, hash_task

    if edited_task:
        return
    for task in tasks:
        changed = compare_to_pin(hash_task(task.path), committed_task(task.path))
        if changed:
            raise BadOption(f"{task.name}: the task differs from its pin (the project's HEAD commit): "
                            f"{', '.join(changed)}; commit the change for review, or pass {EDITED_TASK_OPTION} to "
                            "run it anyway (its results then say TASK EDITED and are never compared with the "
                            "pinned task's)")
