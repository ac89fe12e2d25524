"""The half of kpremote that runs on the GPU host.

Imports only the standard library, torch, triton and pynvml, so it can be shipped as plain files
(content-hashed) and run by the host's own python without installing anything. Its parts are its folders
(docs/architecture.md), in layers: sandbox/ < task/ (the task contract and builds) < harness/ (the judge) < ncu/
(Nsight Compute) < run/ (a run and its record) < slurm/ (Slurm clusters); a folder imports only those before it
(tests/unit/test_import_cycles.py). What both halves or all parts share stays here.
"""

from pathlib import Path

__all__ = ["AGENT_HOME", "__main__", "atomicfile", "boot", "contract", "filelock", "harness", "protocol",
           "provenance", "record", "results", "run", "task"]

# The folder that holds kpremote/: what a process the agent spawns needs on PYTHONPATH to import the agent.
AGENT_HOME = Path(__file__).resolve().parents[2]
