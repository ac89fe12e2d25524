#!/usr/bin/env bash
# The main job, from a fresh machine: an example task through `inv run` on the default `local` host.
# With a GPU that is a real run; without one, a CPU smoke run through Triton's interpreter on the task's
# small rows, labelled "smoke: timings are not meaningful". Extra arguments go to `inv run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m invoke run --host local --task h200_diffusion_fuse_scale_shift__multi_shape "$@"
