"""`inv new-task NAME`: the scaffold makes a complete task that passes a CPU smoke run at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.test_runner import results_of, run_agent
from kpremote.agent.task.taskspec import load_task
from kpremote.errors import ScaffoldError
from kpremote.task.scaffold import arch_for, new_task


def test_new_task_passes_a_cpu_smoke_run_at_once(tmp_path: Path) -> None:
    task = new_task("h200_demo__multi_shape", tmp_path / "kernels")
    assert task == tmp_path / "kernels" / "h200_demo__multi_shape"
    done = run_agent(task, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    results = results_of(tmp_path / "run")
    assert results["status"] == "passed" and results["smoke"] is True
    assert [row["status"] for row in results["rows"]] == ["PASSED", "PASSED"]


def test_new_task_is_complete_and_named(tmp_path: Path) -> None:
    task = new_task("b200_norm", tmp_path)
    files = sorted(p.relative_to(task).as_posix() for p in task.rglob("*") if p.is_file())
    assert files == [
        "baseline/kernel.py", "bench/adapter.py", "bench/workloads.toml", "docs/baseline_source.md",
        "docs/benchmark_method.md", "docs/dispatch.md", "docs/results.md", "docs/run_log.md",
        "solution/kernel.py", "task.toml",
    ]
    assert all("__NAME__" not in (task / f).read_text() and "__ARCH__" not in (task / f).read_text() for f in files)
    assert (task / "solution" / "kernel.py").read_text() == (task / "baseline" / "kernel.py").read_text()
    spec = load_task(task)
    assert (spec.task.name, spec.task.arch, spec.build.kind) == ("b200_norm", "b200", "triton")
    assert "# b200_norm: results" in (task / "docs" / "results.md").read_text()


def test_an_existing_folder_is_refused_and_left_alone(tmp_path: Path) -> None:
    existing = tmp_path / "taken"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    with pytest.raises(ScaffoldError, match="already exists"):
        new_task("taken", tmp_path)
    assert [p.name for p in existing.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("name", ["", "../escape", "has space", ".hidden", "a/b", "x" * 101])
def test_bad_names_are_refused_and_nothing_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(ScaffoldError, match="bad task name"):
        new_task(name, tmp_path / "kernels")
    assert not (tmp_path / "kernels").exists()


@pytest.mark.parametrize(("name", "arch"), [("h200_x", "h200"), ("B200_x", "b200"), ("h100_y", "h100"), ("mytask", "any")])
def test_arch_follows_the_name_prefix(name: str, arch: str) -> None:
    assert arch_for(name) == arch
