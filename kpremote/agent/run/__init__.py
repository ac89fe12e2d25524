"""A run and its bookkeeping: the runner that drives one run, its record on disk (paths, state, events, the
summary and its report), and the commands about runs (start, follow, status, cancel).
"""
