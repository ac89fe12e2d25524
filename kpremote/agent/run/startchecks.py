"""A start's request (StartRequest), and what a start refuses before any run record or lease exists: a task the
runner would refuse, a Python that cannot run it (no torch, a CPU-only torch for a CUDA run, a build kind's missing
package); and the task's arch.
"""

from __future__ import annotations

import importlib.util
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..protocol import PROFILE_MODE_PREFIX, RUNNERS, IdlePolicy, TaskRefused, UnusablePython, run_kind


@dataclass
class StartRequest:
    task: str
    device: str = "auto"  # "auto" | "cuda" | "cpu"
    gpu: str | None = None  # index or UUID
    policy: IdlePolicy = field(default_factory=IdlePolicy)
    arch: str = "any"
    wait_s: float = 0.0
    lease: bool = True
    workloads: str | None = None
    mode: str | None = None  # a timing run's mode
    profile: str | None = None  # a profile run's request (protocol.ProfileRequest as JSON)
    host_alias: str | None = None
    run_id: str | None = None  # chosen by the client, so it can cancel the run before it hears back
    audit: str | None = None  # "off": no Nsight Compute audit (the run reads "unaudited: --no-audit")

    @property
    def runner_module(self) -> str:
        return RUNNERS[run_kind(self.profile)]

    @property
    def recorded_mode(self) -> str | None:
        """The run record's mode: a timing run's, or "profile:" + the request."""
        return self.mode if self.profile is None else PROFILE_MODE_PREFIX + self.profile


def refuse_bad_task(workspace: Path, request: StartRequest) -> Any:
    """The checks the runner would make first, made before any run record exists; messages name the task as the
    user knows it (kernels/<task>/...), not this host's copy."""
    from ..task.taskspec import TaskSpecError, load_task

    try:
        spec = load_task(workspace, timing_mode=request.mode, packages=False)
        spec.select([w.strip() for w in request.workloads.split(",") if w.strip()] if request.workloads else None)
    except TaskSpecError as exc:
        raise TaskRefused(_users_path(str(exc), workspace, request.task)) from None
    return spec


def refuse_missing_packages(workspace: Path, spec: Any) -> None:
    """A build kind whose package this Python lacks: the host's problem (another host may have it), so not a
    task refusal; refused before any record or lease all the same."""
    from ..task.buildrules import check_packages
    from ..task.taskspec import TaskSpecError

    try:
        check_packages(workspace / "task.toml", spec.build)
    except TaskSpecError as exc:
        raise UnusablePython(_users_path(str(exc), workspace, spec.task.name)) from None


def _users_path(message: str, workspace: Path, task: str) -> str:
    from ..task.taskspec import shown

    for form in {str(workspace), str(workspace.resolve()), shown(workspace)}:
        message = message.replace(form, f"kernels/{task}")
    return message


def refuse_unusable_python(device: str) -> None:
    """Refuse, before anything is leased, a run this interpreter cannot do: no torch, or a CPU-only torch for cuda."""
    where = f"{sys.executable} on {socket.gethostname()}"
    if importlib.util.find_spec("torch") is None:
        raise UnusablePython(f"torch is not installed for {where}; set python for this host in hosts.toml to an "
                             "interpreter that has torch and triton")
    if device == "cuda" and torch_cuda_build() is None:
        raise UnusablePython(f"the torch of {where} has no CUDA (a CPU-only build); set python for this host in "
                             "hosts.toml to one with a CUDA build of torch, or run with --device cpu")


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (None: CPU-only, or no torch), read from torch/version.py without
    importing torch, which takes seconds on a busy host."""
    spec = importlib.util.find_spec("torch")
    namespace: dict[str, Any] = {}
    try:
        version_py = Path(spec.submodule_search_locations[0], "version.py")
        exec(version_py.read_text(), namespace)  # noqa: S102 - torch's own generated constants file
    except (AttributeError, TypeError, IndexError, OSError, SyntaxError, ImportError):
        return None
    return namespace.get("cuda")


def task_arch(workspace: Path) -> str | None:
    """[task] arch of the synced task.toml ("h200"; a list as "h200,b200"), or None when it cannot be read (the
    runner refuses such a task)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: the runner still checks the arch when it leases for itself
        return None
    try:
        task = tomllib.loads((workspace / "task.toml").read_text()).get("task")
    except (OSError, ValueError):
        return None
    arch = task.get("arch") if isinstance(task, dict) else None  # `task = 1` is the runner's to refuse, clearly
    if isinstance(arch, list) and arch and all(isinstance(name, str) for name in arch):
        return ",".join(arch)
    return arch if isinstance(arch, str) else None
