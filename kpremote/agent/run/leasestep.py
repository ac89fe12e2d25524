"""The runner's lease step (Runner, runner.py): the run's device, its GPU leased (or the lease its start passed on
adopted), what the GPU read before and after, and the foreign processes watched from then on; the lease released
before the summary is written."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .. import lease, nvml
from .guards import ForeignWatch
from .runstate import update_state
from .stopping import Abort


class LeaseStep:
    """Methods of Runner: they read and set its ctx (RunContext), options and run_dir."""

    def _take_gpu(self) -> None:
        self.ctx.device = nvml.resolve_device(self.options.device)
        update_state(self.run_dir, device=self.ctx.device)
        if self.ctx.device != "cuda":
            if not self.options.workloads:
                self.ctx.selected = self.ctx.spec.smoke_rows()
            return
        root = self._lease_root()
        self.ctx.lease_root = root
        try:
            policy = lease.IdlePolicy.from_json(os.environ.get("KPREMOTE_IDLE"))
            if self.options.lease_fd is not None:
                self.ctx.lease = self._adopt_lease(root)
            else:
                self.ctx.lease = lease.acquire(root, policy=policy, arch=self.ctx.spec.task.arch,
                                               run_id=self.run_dir.name, task=self.ctx.spec.task.name,
                                               gpu=self.options.gpu)
        except lease.AgentError as exc:
            raise Abort(str(exc)) from None
        snap = nvml.snapshot()
        self.ctx.gpu_readings = snap.source
        gpu = snap.find(self.ctx.lease.gpu.uuid) or self.ctx.lease.gpu
        self.ctx.gpu, self.ctx.driver, self.ctx.gpu_before = gpu, snap.driver, gpu.to_json()
        update_state(self.run_dir, gpu=gpu.to_json())
        self.ctx.watch = ForeignWatch(gpu.uuid, {p.get("pid") for p in gpu.processes or []}, gpu.memory_used_mib,
                                      policy.max_memory_mib)

    def _lease_root(self) -> Path:
        if self.options.root:
            return self.options.root
        if os.environ.get("KPREMOTE_ROOT"):
            return Path(os.environ["KPREMOTE_ROOT"]).expanduser()
        for ancestor in self.run_dir.parents:  # ROOT/tasks/<task>/runs/<id>
            if ancestor.name == "tasks":
                return ancestor.parent
        return Path.home() / "kpremote"

    def _adopt_lease(self, root: Path) -> Any:
        fd = self.options.lease_fd
        uuid = self.options.gpu or json.loads(os.pread(fd, 1 << 16, 0) or b"{}").get("uuid")
        gpu = nvml.snapshot().find(uuid) if uuid else None
        if gpu is None:
            raise Abort(f"inherited lease names GPU {uuid!r}, which NVML does not show")
        return lease.adopt(fd, gpu, lease.lock_path(root, gpu.uuid))

    def _release_gpu(self) -> None:
        if self.ctx.lease is None:
            return
        gpu = nvml.snapshot().find(self.ctx.gpu.uuid) if self.ctx.gpu else None
        self.ctx.gpu_after = gpu.to_json() if gpu else None
        self.ctx.lease.release()
        self.ctx.lease = None
