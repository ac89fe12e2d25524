"""Slurm clusters (docs/slurm.md): the slurm-* command line (commands.py), a run submitted on the login node
(slurmsubmit.py), run as a job step on a compute node (slurmstep.py), followed, listed and cancelled through Slurm
(slurmruns.py, slurmsettle.py, slurmjobs.py), and nothing outliving its step (slurmreaper.py).
"""

__all__ = ["commands", "slurmstep"]
