from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rig import Rig

@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory):
    for tool in ("sshd", "ssh-keygen"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is missing: run the README's test command (it installs openssh-server and rsync)")
    rig = Rig(tmp_path_factory.mktemp("rig"))
    yield rig
    rig.stop_all()
