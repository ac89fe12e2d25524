"""Nsight Compute: running ncu and reading its report (ncu.py), the audit that re-measures each production row
under ncu (audit.py), a profile run (profile.py, profilereport.py), and the process ncu measures for both
(profiledcall.py).
"""
