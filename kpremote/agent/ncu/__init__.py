"""Nsight Compute: running ncu and reading its report (ncu.py), the audit that re-measures each production row
under ncu (audit.py; its processes: auditprocesses.py; its secret-seeded cases: auditcases.py), and a profile's
summary (profilereport.py). The process ncu measures is the judge's (harness/profiledcall.py); the profile run
itself is a run's (run/profile.py).
"""

__all__ = ["audit", "auditcases", "ncu", "profilereport"]
