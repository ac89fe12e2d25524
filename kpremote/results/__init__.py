"""The results on this machine: the runs fetched so far (runstore.py), the task's ledger of every run fetched or
checked (ledger.py; records.py: the client's key and each line's MAC), a run compared with another (compare.py) and
a task's history (history.py), and docs/schemas/results.json drawn from the records that write it (schemas.py)."""

__all__ = ["compare", "history", "ledger", "records", "runstore", "schemas"]
