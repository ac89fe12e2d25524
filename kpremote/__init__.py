"""kpremote: run GPU kernel optimization tasks on remote GPU hosts over SSH (`__version__`: this release).

Its parts are its folders (docs/architecture.md): cli/, hosts/, transport/, task/, runs/, results/, views/, skill/,
and the agent that runs on a host (agent/); at the top the two entry points (commands.py for `inv`, program.py for
`kpremote`) and what every part shares (errors.py, project.py).
"""

__all__ = ["__version__", "cli", "commands", "errors", "hosts", "program", "project", "results", "runs", "skill",
           "task", "transport", "views"]

__version__ = "0.1.0"
