"""The half of kpremote that runs on the GPU host.

Imports only the standard library, torch, triton and pynvml, so it can be shipped as plain files
(content-hashed) and run by the host's own python without installing anything. Its parts are its folders
(docs/architecture.md): harness/ (the judge), run/ (a run and its record), task/ (the task contract and builds),
ncu/ (Nsight Compute), slurm/ (Slurm clusters), sandbox/; what both halves or all parts share stays here.
"""

from pathlib import Path

# The folder that holds kpremote/: what a process the agent spawns needs on PYTHONPATH to import the agent.
AGENT_HOME = Path(__file__).resolve().parents[2]
