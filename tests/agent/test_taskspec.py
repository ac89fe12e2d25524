"""taskspec: the contract is read into dataclasses, and every break of it is named (file, field, allowed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kpremote.agent.run.startchecks import task_arch
from kpremote.agent.task.taskspec import TaskSpecError, load_task

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "tiny_rmsnorm"


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the fixture task; the working folder is its parent, so errors show tiny_rmsnorm/..."""
    copy = tmp_path / "tiny_rmsnorm"
    shutil.copytree(FIXTURE, copy)
    monkeypatch.chdir(tmp_path)
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def refusal(task: Path) -> str:
    with pytest.raises(TaskSpecError) as caught:
        load_task(task)
    return str(caught.value)


def test_fixture_task_loads_into_dataclasses(task: Path) -> None:
    spec = load_task(task)
    assert (spec.task.name, spec.task.arch, spec.build.kind, spec.build.entry) == ("tiny_rmsnorm", "any", "triton", "kernel")
    assert spec.timing.seeds == 2 and spec.timing.timeout_s == 120 and spec.timing.min_samples == 10
    assert [w.id for w in spec.workloads] == ["prod_r4_c64", "prod_r3_c100", "grid_r1_c33"]
    assert [w.production for w in spec.workloads] == [True, True, False]
    first = spec.workloads[0]
    assert first.params["dtype"] == "float32" and first.params["eps"] == 1e-6 and first.params["shape"] == [4, 64]
    assert [w.id for w in spec.select(["grid_r1_c33", "prod_r4_c64"])] == ["prod_r4_c64", "grid_r1_c33"]


def test_unknown_build_kind_names_file_field_and_choices(task: Path) -> None:
    edit(task / "task.toml", 'kind = "triton"', 'kind = "rust"')
    assert refusal(task) == 'tiny_rmsnorm/task.toml: [build] kind = "rust" — allowed: "triton", "cuda", "tvm-ffi", "cutedsl", "python"'


@pytest.mark.parametrize(
    "build_text",
    [
        'kind = "triton"\nflags = []\nflags_candidate = ["-O3"]',
        'kind = "triton"\nflags = []\n\n[build.candidate]\nflags = ["-O3"]',
        'kind = "triton"\nflags = []\nextra_cuda_cflags = ["--use_fast_math"]',
    ],
)
def test_per_side_build_settings_are_refused(task: Path, build_text: str) -> None:
    edit(task / "task.toml", 'kind = "triton"\nflags = []', build_text)
    assert "per-side build settings are refused" in refusal(task)


def test_a_separate_table_for_one_side_is_refused(task: Path) -> None:
    (task / "task.toml").write_text((task / "task.toml").read_text() + '\n[solution]\nflags = ["-O3"]\n')
    assert "tiny_rmsnorm/task.toml: [solution] — per-side settings are refused" in refusal(task)


def test_triton_tasks_take_no_flags(task: Path) -> None:
    edit(task / "task.toml", "flags = []", 'flags = ["-O3"]')
    assert 'must be [] for kind = "triton"' in refusal(task)


def test_cuda_sources_must_exist_on_both_sides(task: Path) -> None:
    edit(task / "task.toml", 'kind = "triton"\nflags = []', 'kind = "cuda"\nflags = ["-O3"]\nsources = ["kernel.cu"]')
    (task / "baseline" / "kernel.cu").write_text("// baseline\n")
    message = refusal(task)
    assert "needs 'kernel.cu' on both sides" in message and "tiny_rmsnorm/solution" in message
    (task / "solution" / "kernel.cu").write_text("// candidate\n")
    spec = load_task(task)
    assert spec.build.flags == ("-O3",) and spec.build.sources == ("kernel.cu",)


@pytest.mark.parametrize(
    "source",
    [
        "from torch.utils.cpp_extension import load_inline\n",
        "import torch.utils.cpp_extension as ext\n",
        "import ctypes\nlib = ctypes.CDLL('./fast.so')\n",
        "import torch\ntorch.ops.load_library('fast.so')\n",
    ],
)
def test_a_side_that_builds_or_loads_its_own_binary_is_refused(task: Path, source: str) -> None:
    kernel = task / "solution" / "kernel.py"
    kernel.write_text(kernel.read_text() + "\n" + source)
    message = refusal(task)
    assert message.startswith("tiny_rmsnorm/solution/kernel.py:") and "builds or loads its own binary" in message


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\next = importlib.import_module('torch.utils.cpp_' + 'extension')\n",
        "ext = __import__('torch.utils.cpp_' + 'extension')\n",
        "exec('from torch.utils import cpp_' + 'extension')\n",
    ],
)
def test_a_side_that_imports_or_runs_code_by_a_computed_name_is_refused(task: Path, source: str) -> None:
    kernel = task / "solution" / "kernel.py"
    kernel.write_text(kernel.read_text() + "\n" + source)
    message = refusal(task)
    assert message.startswith("tiny_rmsnorm/solution/kernel.py:") and "imports or runs code by a computed name" in message


def test_mentioning_the_builder_in_text_is_not_building(task: Path) -> None:
    kernel = task / "solution" / "kernel.py"
    kernel.write_text('"""Unlike cpp_extension.load_inline, this stays pure Triton."""\n' + kernel.read_text())
    load_task(task)


def test_unknown_timing_key_gets_a_suggestion(task: Path) -> None:
    edit(task / "task.toml", "seeds = 2", "min_sample = 5")
    message = refusal(task)
    assert "[timing] min_sample — unknown key (did you mean 'min_samples'?)" in message


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("target_rse = 2.0", "[timing] target_rse = 2.0 — allowed: 0 < x < 1"),
        ("min_samples = 0", "[timing] min_samples = 0 — allowed: a number > 0"),
        ("min_samples = 2.5", "[timing] min_samples = 2.5 — allowed: a whole number > 0"),
        ('mode = "hot"', '[timing] mode = "hot" — allowed: "cold", "graph"'),
        ("max_samples = 5", "[timing] max_samples = 5 — must be >= min_samples"),
    ],
)
def test_timing_overrides_are_checked(task: Path, line: str, expected: str) -> None:
    edit(task / "task.toml", "seeds = 2", line)
    assert expected in refusal(task)


def test_mode_from_the_command_line_overrides_and_is_checked(task: Path) -> None:
    assert load_task(task, timing_mode="graph").timing.mode == "graph"
    with pytest.raises(TaskSpecError, match='--mode = "warm" — allowed: "cold", "graph"'):
        load_task(task, timing_mode="warm")


def test_task_name_must_match_its_folder(task: Path) -> None:
    edit(task / "task.toml", 'name = "tiny_rmsnorm"', 'name = "other"')
    assert "must equal the folder name 'tiny_rmsnorm'" in refusal(task)


def test_host_workspace_layout_is_accepted(tmp_path: Path) -> None:
    workspace = tmp_path / "tasks" / "tiny_rmsnorm" / "workspace"
    shutil.copytree(FIXTURE, workspace)
    assert load_task(workspace).task.name == "tiny_rmsnorm"


def test_unknown_arch(task: Path) -> None:
    edit(task / "task.toml", 'arch = "any"', 'arch = "a100"')
    assert '[task] arch = "a100" — allowed: "b200", "h200", "h100", "any"' in refusal(task)


def test_one_task_folder_may_serve_several_arches(task: Path) -> None:
    edit(task / "task.toml", 'arch = "any"', 'arch = ["h200", "b200"]')
    spec = load_task(task)
    assert (spec.task.arch, spec.task.arches) == ("h200,b200", ("h200", "b200"))  # lease.acquire takes either
    assert task_arch(task) == "h200,b200"  # what `start` leases by, read without the whole contract
    edit(task / "task.toml", 'arch = ["h200", "b200"]', 'arch = "h200"')
    assert (load_task(task).task.arch, load_task(task).task.arches, task_arch(task)) == ("h200", ("h200",), "h200")


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("[]", '[task] arch = [] — allowed: "b200", "h200", "h100", "any", or a list of them, e.g. arch = ["h200", '),
        ('["h200", "a100"]', '[task] arch = ["h200", "a100"] — "a100" is not an arch; allowed: "b200", "h200", '),
        ('["h200", "h200"]', '[task] arch = ["h200", "h200"] — name each arch once'),
        ('["any", "h200"]', '[task] arch = ["any", "h200"] — "any" already means every arch: write arch = "any" alone'),
        ("3", "[task] arch = 3 — allowed: "),
        ('"h200,b200"', '[task] arch = "h200,b200" — allowed: '),
    ],
)
def test_an_arch_list_is_checked(task: Path, arch: str, expected: str) -> None:
    edit(task / "task.toml", 'arch = "any"', f"arch = {arch}")
    message = refusal(task)
    assert message.startswith("tiny_rmsnorm/task.toml: ") and expected in message and "\n" not in message


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('id = "grid_r1_c33"', 'id = "prod_r4_c64"', "ids must be unique"),
        ('id = "grid_r1_c33"', 'id = "has space"', "[[workload]] #3 id = 'has space' — allowed"),
        ('id = "grid_r1_c33"', 'id = "grid_r1_c33"\natol = -1', "(grid_r1_c33) atol = -1 — allowed: a number >= 0"),
        ("production = true\npreset", 'production = "yes"\npreset', "production = 'yes' — allowed: true, false"),
        ("[defaults]", "[default]", "[default] — unknown table (did you mean 'defaults'?)"),
    ],
)
def test_workload_rows_are_checked(task: Path, old: str, new: str, expected: str) -> None:
    edit(task / "bench" / "workloads.toml", old, new)
    message = refusal(task)
    assert message.startswith("tiny_rmsnorm/bench/workloads.toml:") and expected in message


def test_selecting_an_unknown_workload_suggests_the_closest(task: Path) -> None:
    with pytest.raises(TaskSpecError, match="no workload 'prod_r4_c65' \\(did you mean 'prod_r4_c64'\\?\\)"):
        load_task(task).select(["prod_r4_c65"])


def test_adapter_must_define_both_calls_with_the_same_parameters(task: Path) -> None:
    adapter = task / "bench" / "adapter.py"
    original = adapter.read_text()
    edit(adapter, "def call_candidate(workload, inputs, outputs):", "def call_candidate(workload, inputs, outputs, fast=True):")
    assert "call_baseline and call_candidate take different parameters" in refusal(task)
    adapter.write_text(original.replace("def call_candidate(", "def _call_candidate("))
    assert "defines no call_candidate" in refusal(task)


def test_missing_and_broken_files_are_named(task: Path) -> None:
    (task / "bench" / "workloads.toml").write_text("[[workload]\n")
    assert refusal(task).startswith("tiny_rmsnorm/bench/workloads.toml: not valid TOML")
    (task / "bench" / "workloads.toml").unlink()
    assert refusal(task) == "tiny_rmsnorm/bench/workloads.toml: missing (see docs/task-contract.md)"


# ------------------------------------------------------------------------------------------------ pinned upstream files

UPSTREAM_TEXT = b"def upstream_kernel():\n    return 1\n"


def pin_upstream_file(task: Path, rel: str = "pkg/kern.py", data: bytes = UPSTREAM_TEXT) -> Path:
    """What `inv baseline --pypi` leaves: the file under baseline/upstream/ and its sha256 in task.toml."""
    import hashlib

    local = task / "baseline" / "upstream" / rel
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    text = (task / "task.toml").read_text()
    text = text.replace("[build]", 'release = "pkg 1.0"\nwheel = "pkg-1.0-py3-none-any.whl"\nwheel_sha256 = "'
                        + "0" * 64 + f'"\n\n[baseline.sha256]\n"{rel}" = "{hashlib.sha256(data).hexdigest()}"\n\n[build]', 1)
    (task / "task.toml").write_text(text)
    return local


def test_a_release_pin_is_read_and_its_files_are_checked(task: Path) -> None:
    pin_upstream_file(task)
    spec = load_task(task)
    assert (spec.baseline.release, spec.baseline.wheel) == ("pkg 1.0", "pkg-1.0-py3-none-any.whl")
    assert [rel for rel, _ in spec.baseline.sha256] == ["pkg/kern.py"]


def test_an_upstream_file_that_differs_from_its_pin_is_refused(task: Path) -> None:
    local = pin_upstream_file(task)
    local.write_bytes(UPSTREAM_TEXT.replace(b"1", b"2"))
    message = refusal(task)
    assert message.startswith("tiny_rmsnorm/baseline/upstream/pkg/kern.py: sha256 ")
    assert "differs from task.toml [baseline.sha256]" in message and "\n" not in message


def test_a_missing_upstream_file_is_refused(task: Path) -> None:
    pin_upstream_file(task).unlink()
    assert refusal(task).startswith("tiny_rmsnorm/baseline/upstream/pkg/kern.py: missing — task.toml [baseline.sha256]")


@pytest.mark.parametrize("rel", ["../../escape.py", "/etc/passwd", "pkg/../../x.py", "a//b.py"])
def test_a_pinned_path_outside_upstream_is_refused(task: Path, rel: str) -> None:
    pin_upstream_file(task)
    edit(task / "task.toml", '"pkg/kern.py" =', f'"{rel}" =')
    assert "[baseline.sha256]" in refusal(task) and "no '..'" in refusal(task)


def test_a_pinned_digest_must_be_a_sha256(task: Path) -> None:
    pin_upstream_file(task)
    text = (task / "task.toml").read_text()
    (task / "task.toml").write_text(text.replace('"pkg/kern.py" = "', '"pkg/kern.py" = "z', 1))
    assert "64 lowercase hex digits" in refusal(task)


def test_the_agent_refuses_a_run_over_a_changed_upstream_file_in_one_line(task: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    pin_upstream_file(task).write_bytes(b"edited\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "kpremote.agent.run.runner", "--task-dir", str(task), "--run-dir",
                           str(tmp_path / "run"), "--device", "cpu"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 2, done.stderr
    import json

    state = json.loads((tmp_path / "run" / "state.json").read_text())  # what inv run / inv logs show
    assert state["message"].startswith("refused: tiny_rmsnorm/baseline/upstream/pkg/kern.py: sha256 ")
    assert "\n" not in state["message"] and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "raw" / "build").exists()  # refused before anything was built
