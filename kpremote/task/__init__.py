"""A task of the project, as this machine holds it: kernels/<task> found once per command (taskdir.py), what it holds
as the sync sees it (taskscan.py), a new one scaffolded (scaffold.py), and its pinned upstream baseline: pinned and
materialized (baseline.py) from a commit in git's object store (upstreamgit.py) or a release wheel (wheels.py), its
task.toml table and docs edited (baselinetoml.py, baselinedoc.py), moved into place whole (staging.py), and its
copied-lines digest (upstreamlines.py)."""
