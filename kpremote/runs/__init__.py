"""Runs on the hosts, as this client starts and follows them: a start with the sync in its channel, follow, cancel
and status (remote.py; session.py: the session a run's calls go over, what a start asks and gives back; runids.py:
ids as people type them; slurm.py: a cluster's submit), the sync conversation (sync.py), runs placed on a group's
hosts and followed live (placement.py), a profile run (profile.py), the summary fetched home (fetch.py, checked by
safetar.py), `inv check` here on the CPU (check.py), every event as a JSON line (eventstream.py), and one Ctrl-C that
cancels all of it (interrupt.py)."""
