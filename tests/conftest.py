from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from kpremote.agent import nvml
from kpremote.transport.openssh import CONTROL_DIR_ENV
from rig import Rig

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
