"""The task contract and the builds: task.toml and workloads.toml read and refused (taskspec.py), the folder's
files (taskfiles.py), task code imported from source only (sourceonly.py), which build kinds may face each other
(buildrules.py), and the builds (build.py, builders/). The prepare worker that runs them is a run's
(run/worker.py). The adapter's Case stays at kpremote/agent/contract.py: task code imports it by that name.
"""

__all__ = ["build", "builders", "buildrules", "taskrecords", "taskspec"]
