"""One place for each rule (CONTRIBUTING.md): the rules that had copies are defined once, and that one is right.

Definitions are found by reading the source (AST), so a copy that comes back under the same name fails here."""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

import pytest

import kpremote
from kpremote.agent import nvml
from kpremote.agent.provenance import file_sha256

PACKAGE = Path(kpremote.__file__).parent


@functools.lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    """A kpremote module's syntax tree, parsed once for all the tests of this file (each reads every module)."""
    return ast.parse(path.read_text(), str(path))


@functools.lru_cache(maxsize=None)
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module's tree, walked once for all the tests of this file."""
    return tuple(ast.walk(tree(path)))


def definitions(name: str) -> list[str]:
    """Where a function or class called `name` is defined in kpremote/, as "path:line"."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in nodes(path):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
                found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}")
    return found


def sha256_of_a_file_definitions() -> list[str]:
    """Functions that hash a whole file's content with sha256: whatever their name, hashlib.sha256 next to an
    open() or read_bytes() of one path."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in nodes(path):
            if not isinstance(node, ast.FunctionDef) or "sha256" not in node.name or "tree" in node.name:
                continue
            calls = {ast.unparse(call.func) for call in ast.walk(node) if isinstance(call, ast.Call)}
            if any(c.endswith("sha256") for c in calls) and calls & {"open", "os.open", "path.read_bytes"}:
                found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.name}")
    return found


def test_one_file_sha256():
    assert sha256_of_a_file_definitions() == ["agent/provenance.py:file_sha256"]


def test_file_sha256_is_the_content_digest_and_refuses_a_link(tmp_path):
    (tmp_path / "f").write_bytes(b"abc" * 100_000)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert file_sha256(tmp_path / "f") == hashlib.sha256(b"abc" * 100_000).hexdigest()
    with pytest.raises(OSError):
        file_sha256(tmp_path / "link")


def test_one_device_rule():
    assert [where.split(":")[0] for where in definitions("resolve_device") + definitions("_resolve_device")] == [
        "agent/nvml.py"]


def gpu_snapshot(source: str, gpus: int) -> nvml.Snapshot:
    gpu = nvml.GpuState.from_json({"index": 0, "uuid": "GPU-0", "name": "H200", "cc": [9, 0], "memory_used_mib": 0,
                                   "memory_total_mib": 143771})
    return nvml.Snapshot(hostname="h", driver="1", source=source, gpus=[gpu] * gpus)


@pytest.mark.parametrize(("device", "snap", "expected"), [
    ("auto", gpu_snapshot("nvml", 1), "cuda"),
    ("auto", gpu_snapshot("nvml", 0), "cpu"),
    ("auto", gpu_snapshot("fixture", 1), "cpu"),  # a fixture's GPUs are not real
    ("cpu", gpu_snapshot("nvml", 1), "cpu"),
    ("cuda", None, "cuda"),  # a device named is not looked up
])
def test_auto_is_cuda_only_where_nvml_itself_shows_a_gpu(device, snap, expected):
    def snapshot() -> nvml.Snapshot:
        assert snap is not None, "looked up a device that was named"
        return snap

    assert nvml.resolve_device(device, snapshot) == expected


def test_auto_is_cpu_where_nvml_cannot_be_read():
    def broken() -> nvml.Snapshot:
        raise RuntimeError("NVML Shared Library Not Found")

    assert nvml.resolve_device("auto", broken) == "cpu"


def exit_code_literals() -> list[str]:
    """Module-level names like EXIT_FAILED or DISK_FULL_EXIT that the agent binds to integer literals of its own."""
    found = []
    for path in sorted((PACKAGE / "agent").rglob("*.py")):
        for node in tree(path).body:
            if not isinstance(node, ast.Assign):
                continue
            names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if any("EXIT" in name and not name.endswith("_S") for name in names) and \
                    any(isinstance(v, ast.Constant) and isinstance(v.value, int) for v in values):
                found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}")
    return found


def test_the_agent_takes_its_exit_codes_from_protocol():
    """ExitCode (the agent's subcommands) and RunExit (a runner's process) in protocol.py are the only numbers."""
    assert exit_code_literals() == []


def test_one_run_id_rule():
    """protocol.py makes and checks run ids; the client's start and the agent's claims use its functions."""
    assert [where.split(":")[0] for where in definitions("new_run_id")] == ["agent/protocol.py"]
    makers = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
              if "token_hex(3)" in path.read_text() or "compile(RUN_ID_PATTERN)" in path.read_text()]
    assert makers == ["agent/protocol.py"]


@functools.lru_cache(maxsize=None)
def exception_classes() -> dict[str, list[str]]:
    """Every class in kpremote/ whose bases name an error (…Error, …Exception, Refused, KeyboardInterrupt, or a
    class of this list), by name, with where each is defined."""
    found: dict[str, list[str]] = {}
    known = {"Exception", "BaseException", "KeyboardInterrupt"}
    classes = [(path, [n for n in nodes(path) if isinstance(n, ast.ClassDef)]) for path in sorted(PACKAGE.rglob("*.py"))]
    for _ in range(4):  # subclasses of subclasses, defined in any order
        for path, defined in classes:
            for node in defined:
                bases = {ast.unparse(base).split(".")[-1] for base in getattr(node, "bases", [])}
                if isinstance(node, ast.ClassDef) and bases & known:
                    known.add(node.name)
                    where = f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}"
                    if where not in found.setdefault(node.name, []):
                        found[node.name].append(where)
    return found


def test_each_error_class_is_defined_once():
    assert {name: where for name, where in exception_classes().items() if len(where) > 1} == {}


def test_the_clients_errors_live_in_errors_py():
    """The client's error tree is errors.py (its root and host errors are the transport's, which imports nothing of
    the client); the agent's are protocol.py's and its own modules'."""
    elsewhere = {name: where for name, where in exception_classes().items()
                 if not any(w.startswith(("errors.py", "transport/errors.py", "agent/")) for w in where)}
    assert elsewhere == {}


def private_imports(path: Path, source: str | None = None) -> list[str]:
    """`from X import _name` of a kpremote module (relative or absolute, at the top or inside a function)."""
    found = []
    for node in nodes(path) if source is None else ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kpremote")):
            found += [f"{'.' * node.level}{node.module or ''}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names():
    found = {path.relative_to(PACKAGE).as_posix(): private_imports(path) for path in sorted(PACKAGE.rglob("*.py"))}
    assert {rel: names for rel, names in found.items() if names} == {}


@pytest.mark.parametrize("source", ["from .correctness import guarded, _non_finite\n",
                                    "def f():\n    from ..__main__ import _apply_sync\n",
                                    "from kpremote.agent.run.start import _runner_command\n"])
def test_the_private_import_walk_can_fail(source):
    assert len(private_imports(PACKAGE / "agent" / "harness" / "x.py", source)) == 1


def blocking_flocks(path: Path, source: str | None = None) -> list[str]:
    """fcntl.flock(fd, fcntl.LOCK_EX) calls: a wait for an exclusive lock (a try, with LOCK_NB, is not one)."""
    found = []
    for node in nodes(path) if source is None else ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("flock") and len(node.args) == 2 \
                and "LOCK_EX" in ast.unparse(node.args[1]) and "LOCK_NB" not in ast.unparse(node.args[1]):
            found.append(f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno}")
    return found


def test_one_way_to_hold_a_lock_file():
    """The agent's syncs, run claims and state.json, the client's ledger and the OpenSSH master's start all wait
    for their lock through agent/filelock.py's held()."""
    found = [where for path in sorted(PACKAGE.rglob("*.py")) for where in blocking_flocks(path)]
    assert [where.split(":")[0] for where in found] == ["agent/filelock.py"]


@pytest.mark.parametrize("source", ["fcntl.flock(fd, fcntl.LOCK_EX)\n", "import fcntl as f\nf.flock(lock, f.LOCK_EX)\n"])
def test_the_flock_walk_can_fail(source):
    assert len(blocking_flocks(PACKAGE / "x.py", source)) == 1
    assert blocking_flocks(PACKAGE / "x.py", source.replace("LOCK_EX", "LOCK_EX | fcntl.LOCK_NB")) == []


def test_a_held_lock_makes_the_next_holder_wait(tmp_path):
    """held() waits for the lock a process holds, and closing the descriptor lets the next one in."""
    import subprocess
    import sys
    import time

    from kpremote.agent.filelock import held

    lock = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom kpremote.agent.filelock import held\n"
                               f"with held({str(lock)!r}):\n    print('in', flush=True)\n    time.sleep(0.5)\n"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "in\n"
    started = time.monotonic()
    with held(lock) as fd:
        waited = time.monotonic() - started
        assert fd >= 0
    holder.wait(10)
    assert waited > 0.2  # it waited for the holder
