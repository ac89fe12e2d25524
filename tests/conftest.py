from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kpremote.agent import nvml
from kpremote.results.records import STATE_DIR_ENV
from kpremote.transport.openssh import CONTROL_DIR_ENV
from rig import ONE_THREAD_POOL, Rig

for _name, _value in ONE_THREAD_POOL.items():  # before any test starts a process (rig.py says why)
    os.environ.setdefault(_name, _value)

# The slowest test files, slowest first (measured with --durations on the 2-core machine, 2026-11-26). scripts/test.sh
# hands whole files to its pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder), so these
# start first and the short files fill in behind them: no worker is left alone with a long file at the end. Every
# other file keeps its place after them, and the tests of a file keep their order.
SLOWEST_FIRST = (
    "tests/test_redteam.py",
    "tests/test_slurm.py",
    "tests/test_reliability.py",
    "tests/test_views.py",
    # before tests/kernels/test_tasks_compile.py, as in the files' own order: after it in the same process, its
    # in-process Triton interpreter test fails ("Cannot call @triton.jit'd outside of the scope of a kernel")
    "tests/agent/test_buildkinds.py",
    "tests/kernels/test_inv_check.py",
    "tests/kernels/test_tasks_compile.py",
    "tests/agent/test_adversarial.py",
    "tests/test_interrupts.py",
    "tests/test_run.py",
    "tests/agent/test_inplace.py",
    "tests/test_json_schemas.py",
    "tests/agent/test_runner.py",
    "tests/test_benchmarks.py",
    "tests/agent/test_audit.py",
    "tests/test_skill.py",
    "tests/test_profile.py",
    "tests/kernels/test_new_tasks.py",  # since its interpreter check reduces by halves (triton_tree_reduce.py)
    "tests/test_hostile.py",
    "tests/test_event_stream.py",
    "tests/test_options.py",
    "tests/test_failover.py",
    "tests/test_console_script.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of SLOWEST_FIRST first, in its order; the rest after them as collected (a stable sort)."""
    rank = {name: place for place, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))

@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory):
    for tool in ("sshd", "ssh-keygen"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: run the README's test command (it installs openssh-server and rsync)")
    rig = Rig(tmp_path_factory.mktemp("rig"))
    yield rig
    rig.stop_all()


@pytest.fixture(scope="session", autouse=True)
def private_ssh_masters(tmp_path_factory: pytest.TempPathFactory):
    """This session's OpenSSH masters in a folder of their own (short: a socket path has ~104 bytes), inherited by
    the `inv` processes the tests start: another session's masters on this machine are never shared."""
    folder = Path(tempfile.mkdtemp(prefix="kpssh-", dir="/tmp"))
    before = os.environ.get(CONTROL_DIR_ENV)
    os.environ[CONTROL_DIR_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(CONTROL_DIR_ENV, None)
    else:
        os.environ[CONTROL_DIR_ENV] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def private_records_key(tmp_path_factory: pytest.TempPathFactory):
    """The client's records key (kpremote/results/records.py: what signs ledger lines) in this session's own folder, set before
    any fixture writes a ledger line and inherited by the `inv` processes the tests start: never the user's."""
    folder = tmp_path_factory.mktemp("kpstate")
    before = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(STATE_DIR_ENV, None)
    else:
        os.environ[STATE_DIR_ENV] = before


@pytest.fixture(autouse=True)
def gpu_readings_chosen_per_test():
    """A process decides once where its GPU readings come from (nvml.reader()): each test, which sets
    KPREMOTE_NVML_FIXTURE (or not) for itself, gets that decision afresh, as a new agent process would."""
    nvml.reader.cache_clear()
    yield
    nvml.reader.cache_clear()


@pytest.fixture(params=["openssh", "paramiko"])
def client(request, rig):
    """Run the test once over each SSH client: the hosts.toml the rig writes names it as the host's transport."""
    rig.client = request.param
    yield request.param
    rig.client = None
