"""The task contract and the builds: task.toml and workloads.toml read and refused (taskspec.py), the folder's
files (taskfiles.py), task code imported from source only (sourceonly.py), which build kinds may face each other
(buildrules.py), the builds (build.py, builders/), and the prepare worker that builds each side in a sandboxed
process (worker.py). The adapter's Case stays at kpremote/agent/contract.py: task code imports it by that name.
"""
