"""What people see on the terminal, one module per thing shown: terminal.py (the consoles, errors, waiting lines),
hosts.py (inv hosts), gpus.py (gpu-status in gpustat's layout), runlist.py (inv status), run.py (a run's events,
live and in inv logs), results.py (a results.json as a table), compare.py (inv compare / history), and layout.py
(width-aware tables all of them use)."""

__all__ = ["compare", "gpus", "hosts", "nodes", "results", "run", "runlist", "start", "terminal"]
