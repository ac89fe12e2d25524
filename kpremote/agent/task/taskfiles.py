"""A task folder's files against its contract (docs/task-contract.md): each side holds what its build needs and
neither builds or loads its own binary, the adapter defines the contract's calls with one signature for both sides,
and the pinned upstream files are there byte for byte. task.toml and workloads.toml themselves are read by
taskspec.py, which runs these checks once it has read them.

Standard library only: source files are read as syntax trees, never imported.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Any

from .buildrules import needed_field, needed_files
from .taskrecords import SIDES, TaskSpec, TaskSpecError, listed, shown, suggestion, toml_text

ADAPTER_REQUIRED = ("make_case", "call_baseline", "call_candidate")
# Names whose use means a side compiles or loads its own binary, outside the one symmetric builder.
SELF_BUILD_NAMES = frozenset({"cpp_extension", "load_inline", "build_inline", "load_library", "load_module", "CDLL",
                              "cdll", "PyDLL", "LoadLibrary", "dlopen"})
# Importing or running code by a computed name hides a self-build from the check above
# (importlib.import_module("torch.utils.cpp_" + "extension")): refused in sides and the adapter too.
DYNAMIC_CODE_NAMES = frozenset({"import_module", "__import__", "exec", "eval"})


def check_upstream_files(spec: TaskSpec) -> None:
    """Each file [baseline.sha256] pins is in baseline/upstream/ with exactly that sha256: the baseline that runs
    is the pinned upstream code, byte for byte."""
    upstream = spec.side_dir("baseline") / "upstream"
    for rel, want in spec.baseline.sha256:
        local = upstream / rel
        if local.is_symlink() or not local.is_file():
            raise TaskSpecError(f"{shown(local)}: missing — task.toml [baseline.sha256] pins it (the client puts it "
                                "there: inv baseline --materialize, inv run, inv sync)")
        got = hashlib.sha256(local.read_bytes()).hexdigest()
        if got != want:
            raise TaskSpecError(f"{shown(local)}: sha256 {got} differs from task.toml [baseline.sha256] {want} — "
                                "refused: the baseline must be the pinned upstream file")


def check_no_bytecode(spec: TaskSpec) -> None:
    """No compiled Python outside a __pycache__ folder: Python imports a lone foo.pyc as module foo, so a reviewed
    foo.py could be shadowed, or replaced, by code nobody reads. (__pycache__ folders are never read: a run's
    processes import task code from source, sourceonly.py.)"""
    tops = [p for p in spec.root.iterdir() if p.name not in ("results", ".kpremote", ".git", "__pycache__")]
    found = [p for top in tops for p in ([top] if top.is_file() else top.rglob("*.py[co]"))
             if p.suffix in (".pyc", ".pyo") and "__pycache__" not in p.relative_to(spec.root).parts]
    for path in sorted(found):
        raise TaskSpecError(f"{shown(path)}: compiled Python in the task folder is refused (it would be imported "
                            "instead of, or without, a reviewed source); delete it")


def check_sides_symmetric(spec: TaskSpec) -> None:
    """Both side folders exist, hold what the one build recipe needs, and neither builds itself."""
    for side in SIDES:
        folder = spec.side_dir(side)
        if not folder.is_dir():
            raise TaskSpecError(f"{shown(folder)}: missing ({side} side)")
    for side in SIDES:
        for name in needed_files(spec.build, side):
            if not (spec.side_dir(side) / name).is_file():
                raise TaskSpecError(
                    f"{shown(spec.root / 'task.toml')}: [build] {needed_field(spec.build, side)} needs {name!r} "
                    f"{'in the ' + side + ' side' if spec.build.kinds[:1] != spec.build.kinds[1:] else 'on both sides'}; "
                    f"missing in {shown(spec.side_dir(side))}"
                )
    for python_file in [*_python_files(spec.side_dir("baseline")), spec.adapter_path, spec.context_path]:
        _refuse_self_build(python_file, dynamic_code=False)  # trusted and pinned (docs/trust.md): symmetry only
    for python_file in _python_files(spec.side_dir("candidate")):
        _refuse_self_build(python_file, dynamic_code=True)


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _refuse_self_build(path: Path, *, dynamic_code: bool) -> None:
    """A side that builds or loads its own binary breaks the one-builder rule; in the untrusted candidate, code
    imported or run by a computed name is refused too, since it could hide exactly that."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except (FileNotFoundError, SyntaxError):
        return  # a missing adapter or a broken side is reported by its own check or by its import
    for node in ast.walk(tree):
        name = _self_build_name(node)
        if name:
            raise TaskSpecError(
                f"{shown(path)}:{node.lineno}: builds or loads its own binary ({name}) — refused: both sides are "
                f"built by the agent with the same builder and flags; use [build] kind = \"cuda\" and sources"
            )
        name = _dynamic_code_name(node) if dynamic_code else None
        if name:
            raise TaskSpecError(
                f"{shown(path)}:{node.lineno}: imports or runs code by a computed name ({name}) — refused: it would "
                f"hide a self-built binary from this check; import modules by name"
            )


def _self_build_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if "cpp_extension" in a.name or a.name == "tvm_ffi.cpp"), None)
    if isinstance(node, ast.ImportFrom):
        if "cpp_extension" in (node.module or "") or (node.module or "") == "tvm_ffi.cpp":
            return f"from {node.module} import ..."
        if node.module == "tvm_ffi" and any(a.name == "cpp" for a in node.names):
            return "from tvm_ffi import cpp"
        return next((a.name for a in node.names if a.name in SELF_BUILD_NAMES), None)
    if isinstance(node, ast.Attribute) and node.attr in SELF_BUILD_NAMES:
        return f".{node.attr}"
    if isinstance(node, ast.Name) and node.id in SELF_BUILD_NAMES:
        return node.id
    return None


def _dynamic_code_name(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    function = node.func
    name = function.id if isinstance(function, ast.Name) else function.attr if isinstance(function, ast.Attribute) else None
    return name if name in DYNAMIC_CODE_NAMES else None


def check_adapter(path: Path) -> None:
    """bench/adapter.py defines the contract's functions, and both calls take the same parameters."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except FileNotFoundError:
        raise TaskSpecError(f"{shown(path)}: missing (see docs/task-contract.md)") from None
    except SyntaxError as exc:
        raise TaskSpecError(f"{shown(path)}:{exc.lineno}: syntax error: {exc.msg}") from None
    functions = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    missing = [name for name in ADAPTER_REQUIRED if name not in functions]
    if missing:
        raise TaskSpecError(f"{shown(path)}: defines no {', '.join(missing)} — required: {listed(ADAPTER_REQUIRED)}")
    shapes = {name: _parameter_shape(functions[name].args) for name in ("call_baseline", "call_candidate")}
    if shapes["call_baseline"] != shapes["call_candidate"]:
        raise TaskSpecError(
            f"{shown(path)}: call_baseline and call_candidate take different parameters — both sides must go "
            f"through the same path: (workload, inputs, outputs)"
        )


def _parameter_shape(args: ast.arguments) -> tuple[Any, ...]:
    """What a caller can pass: counts of positional parameters and defaults, keyword-only names, * and **."""
    return (
        len(args.posonlyargs) + len(args.args),
        len(args.defaults),
        tuple(a.arg for a in args.kwonlyargs),
        args.vararg is not None,
        args.kwarg is not None,
    )


CONTEXTS_NAME = "CONTEXTS"


def check_contexts(spec: TaskSpec) -> None:
    """Every row's `context` names an entry of bench/context.py's CONTEXTS (read as a syntax tree: the names are its
    dict's keys, written as strings). The values are the judge's to check when it imports the file."""
    rows = [(number, w) for number, w in enumerate(spec.workloads, start=1) if w.context is not None]
    if not rows:
        return
    workloads, path = shown(spec.root / "bench" / "workloads.toml"), spec.context_path
    number, first = rows[0]
    if not path.is_file():
        raise TaskSpecError(f"{workloads}: [[workload]] #{number} ({first.id}) context = {toml_text(first.context)} — "
                            f"{shown(path)} is missing (it defines {CONTEXTS_NAME}: docs/task-contract.md, "
                            f"\"In-context rows\")")
    names = context_names(path)
    for number, workload in rows:
        if workload.context not in names:
            has = f"it has {listed(names)}" if names else "it has none"
            raise TaskSpecError(f"{workloads}: [[workload]] #{number} ({workload.id}) context = "
                                f"{toml_text(workload.context)} — not in {shown(path)}'s {CONTEXTS_NAME}"
                                f"{suggestion(str(workload.context), names)}; {has}")


def context_names(path: Path) -> list[str]:
    """The keys of bench/context.py's top-level `CONTEXTS = {"name": ..., ...}`, or the refusal naming the file."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError as exc:
        raise TaskSpecError(f"{shown(path)}:{exc.lineno}: not valid Python: {exc.msg}") from None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if not any(isinstance(t, ast.Name) and t.id == CONTEXTS_NAME for t in targets):
            continue
        value = node.value
        if not isinstance(value, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                      for k in value.keys):
            raise TaskSpecError(f"{shown(path)}:{node.lineno}: {CONTEXTS_NAME} must be a dict written out with string "
                                f"keys: {CONTEXTS_NAME} = {{\"name\": Context(...), ...}}")
        return [k.value for k in value.keys]  # type: ignore[union-attr]
    raise TaskSpecError(f"{shown(path)}: no {CONTEXTS_NAME} at its top level: {CONTEXTS_NAME} = {{\"name\": "
                        f"Context(...), ...}} (kpremote.agent.contract.Context)")
