"""A run and its bookkeeping: the runner that drives one run (runner.py, with its lease step, its children and its
audit step), its prepare worker (worker.py), a profile run (profile.py), its record on disk (paths, state, events,
the summary and its report), and the commands about runs (start, follow, status, cancel).
"""

__all__ = ["cancel", "events", "follow", "liveness", "profile", "rawfiles", "runner", "runpaths", "runstate", "start",
           "startchecks", "summary", "worker"]
