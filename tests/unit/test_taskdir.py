"""TaskDir: a task is found once per command, with the words each refusal has always had."""

from __future__ import annotations

import pytest
from unit.helpers import TASK

from kpremote.errors import ConfigError, KpremoteError
from kpremote.task.taskdir import find_task, find_tasks


def test_a_task_is_its_folder_and_task_toml(kernels):
    [task] = find_tasks(kernels, [TASK])
    assert (task.name, task.path, task.toml, task.results) == (TASK, kernels / TASK, kernels / TASK / "task.toml",
                                                               kernels / TASK / "results")


def test_a_folder_without_task_toml_is_a_folder_but_not_a_task_to_run(kernels):
    (kernels / "notes").mkdir()
    assert find_task(kernels, "notes").path == kernels / "notes"  # inv sync, inv baseline: the folder is enough
    with pytest.raises(KpremoteError, match=f"unknown task 'notes': no {kernels / 'notes' / 'task.toml'}"):
        find_tasks(kernels, [TASK, "notes"])


def test_a_link_or_a_name_outside_the_rule_is_refused_before_anything_is_read(kernels, tmp_path):
    (kernels / "linked").symlink_to(kernels / TASK)
    with pytest.raises(ConfigError, match="unknown task 'linked': no folder"):
        find_tasks(kernels, ["linked"])
    with pytest.raises(ConfigError, match="invalid task name '../demo'"):
        find_tasks(kernels, ["../demo"])
    with pytest.raises(ConfigError, match="did you mean 'demo'"):
        find_task(kernels, "demi")
