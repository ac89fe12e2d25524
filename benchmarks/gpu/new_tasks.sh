#!/usr/bin/env bash
# The new tasks on the lent H200, standalone (no kpremote harness): install the GPU-side wheels, build
# both sides of each task, check each row against the adapter's reference and time both sides, print
# one compact table. For the integrator to debug the tasks in one call. The tasks: KP_TASKS
# (comma-separated folder names), by default qknorm_rope, cutedsl norm_scale_shift, group_norm_silu and
# cutedsl norm_tanh_mul_add (group_norm_silu and norm_tanh_mul_add need only torch and Triton:
# `KP_TASKS=h200_diffusion_group_norm_silu__multi_shape bash benchmarks/gpu/new_tasks.sh check` runs one with no
# wheel staged, its baseline/upstream carried).
#
#   bash benchmarks/gpu/new_tasks.sh upstream   # HERE, before carrying: baseline/upstream/<path> of each
#                                               # task from the sglang wheel its task.toml pins (<path> as
#                                               # the wheel holds it: sglang/...), the wheel and each file
#                                               # checked against the sha256 that task.toml pins
#   bash benchmarks/gpu/new_tasks.sh stage      # GPU: copy the carried wheels/parts into $KP_WHEELS
#   bash benchmarks/gpu/new_tasks.sh install    # GPU: install from $KP_WHEELS into $KP_SITE
#   bash benchmarks/gpu/new_tasks.sh all [ROWS] # GPU: stage + install + check (ROWS: all | prod | smoke)
#   bash benchmarks/gpu/new_tasks.sh check [ROWS]
#   eval "$(bash benchmarks/gpu/new_tasks.sh env)"  # GPU: the exports that make $KP_SITE's packages importable
#                                               # (what `check` sets; benchmarks/gpu/remeasure.sh uses it too)
#
# Folders (environment): KP_WHEELS (default /tmp/kp-wheels) holds the wheels and the cu13 parts that
# `install` reads, so they may be staged there by any earlier call to the same warm machine, e.g. the
# integrator's own `cp`; KP_SITE (default /tmp/site) is where they are installed; SGLANG_WHEEL_DIR
# (default /work/main/.whl/sglang) holds the sglang wheel that `upstream` reads, the one named by each
# task.toml's [baseline] wheel (kpremote's wheel cache is read where that folder lacks it), KP_KERNELS
# (default this checkout's kernels/) the task folders it writes into.
#
# The wheels live in /work/main/.whl (ignored through .git/info/exclude; never committed):
#   .whl/*.whl                      python 3.12 manylinux x86_64 wheels
#   .whl/parts/<cu13 wheel>.parta?  nvidia-cutlass-dsl-libs-cu13 (92 MB), `split -b 40000000`
#   .whl/sglang/sglang-0.5.23-...   the pinned upstream release (only `upstream` reads it)
# A call carries at most 64 MiB and 8 paths, so two calls to the same warm machine (/tmp survives
# while it stays warm):
#   1. carry [.whl/parts/W.partaa, .whl/apache_tvm_ffi-*.whl, .whl/nvidia_cutlass_dsl-*.whl,
#             .whl/nvidia_cutlass_dsl_libs_base-*.whl, .whl/nvidia_cutlass_dsl_libs_core-*.whl,
#             .whl/cuda_bindings-*.whl, .whl/cuda_pathfinder-*.whl, .whl/einops-*.whl]   (~60 MB)
#      command: bash benchmarks/gpu/new_tasks.sh stage
#   2. carry [.whl/parts/W.partab, .whl/parts/W.partac, .whl/protobuf-*.whl,
#             kernels/h200_diffusion_qknorm_rope__multi_shape/baseline/upstream,
#             kernels/h200_diffusion_cutedsl_norm_scale_shift__multi_shape/baseline/upstream,
#             kernels/h200_diffusion_group_norm_silu__multi_shape/baseline/upstream,
#             kernels/h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape/baseline/upstream] (~52 MB)
#      command: bash benchmarks/gpu/new_tasks.sh all
#   (W = nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl)
# Reassembly and install (what `install` does):
#   cat /tmp/kp-wheels/W.parta? > /tmp/kp-wheels/W; sha256sum -c (the sum below)
#   python3 -m pip install --no-deps --target /tmp/site <all the wheels, one command>   (cuda-bindings, cuda-pathfinder,
#     einops, protobuf only where python3 cannot import them already)
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
#   (the cutlass-dsl wheel's .pth file is not read for a --target install, hence the second entry)
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
stage=${KP_WHEELS:-/tmp/kp-wheels}
site=${KP_SITE:-/tmp/site}
cu13=nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
cu13_sha256=50191a381d8cc1393373ae0bc879b0aefa9a256c23c22d4fa1c2fe3dfe57bc90
py=${PYTHON:-python3}
export KP_TASKS=${KP_TASKS:-h200_diffusion_qknorm_rope__multi_shape,h200_diffusion_cutedsl_norm_scale_shift__multi_shape,h200_diffusion_group_norm_silu__multi_shape,h200_diffusion_cutedsl_norm_tanh_mul_add__multi_shape}

upstream() {
  local cache=${KPREMOTE_CACHE:-$HOME/.cache/kpremote}/wheels
  "$py" - "${SGLANG_WHEEL_DIR:-/work/main/.whl/sglang}" "$cache" "${KP_KERNELS:-$repo/kernels}" <<'EOP'
"""Put each task's upstream files from the sglang wheel its task.toml pins at baseline/upstream/<path>,
<path> as the wheel holds it (sglang/..., no python/ prefix: the layout `inv baseline --materialize`
writes), the wheel and each file checked against the sha256 that task.toml pins ([baseline] wheel,
wheel_sha256 and [baseline.sha256], as kpremote.task.baseline checks them)."""
import hashlib, os, pathlib, sys, tomllib, zipfile
folders, kernels = [pathlib.Path(p) for p in sys.argv[1:3]], pathlib.Path(sys.argv[3])
for task in [t for t in os.environ["KP_TASKS"].split(",") if t]:
    folder = kernels / task
    pin = tomllib.loads((folder / "task.toml").read_text())["baseline"]
    found = [f / pin["wheel"] for f in folders if (f / pin["wheel"]).is_file()]
    if not found:
        sys.exit(f"{task}: task.toml pins {pin['wheel']}, in none of {', '.join(map(str, folders))}")
    wheel = found[0]
    wheel_sum = hashlib.sha256(wheel.read_bytes()).hexdigest()
    with zipfile.ZipFile(wheel) as archive:
        files, sums = pin["files"], pin.get("sha256", {})
        if (pin.get("wheel"), pin.get("wheel_sha256")) != (wheel.name, wheel_sum):
            sys.exit(f"{task}: task.toml pins {pin.get('wheel')} sha256 {pin.get('wheel_sha256')}, "
                     f"{wheel} has sha256 {wheel_sum}")
        if sorted(sums) != sorted(files):
            sys.exit(f"{task}: task.toml [baseline.sha256] pins {sorted(sums)}, [baseline] files lists {sorted(files)}")
        contents = {}
        for path in files:
            data = archive.read(path)  # the wheel holds sglang/... at its root
            got = hashlib.sha256(data).hexdigest()
            if got != sums[path]:
                sys.exit(f"{task}: {path}: sha256 {got} in the wheel, task.toml [baseline.sha256] pins {sums[path]}")
            contents[path] = data
        for path, data in contents.items():  # written only once every file of the task matched its pin
            target = folder / "baseline" / "upstream" / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        print(f"{task}: {len(files)} upstream files in baseline/upstream/, sha256 as task.toml pins them")
EOP
}

stage_wheels() {
  mkdir -p "$stage"
  [ "$stage" -ef "$repo/.whl" ] && return 0
  find "$repo/.whl" -type f \( -name '*.whl' -o -name '*.whl.part*' \) -exec cp -n {} "$stage/" \; 2>/dev/null || true
  ls -la "$stage"
}

install() {
  if [ ! -f "$stage/$cu13" ]; then
    ls "$stage/$cu13".parta? > /dev/null 2>&1 || { echo "no $cu13 (or its parts) in $stage (KP_WHEELS): carry them (see the header)"; exit 3; }
    cat "$stage/$cu13".parta? > "$stage/$cu13"
  fi
  echo "$cu13_sha256  $stage/$cu13" | sha256sum -c - || { rm -f "$stage/$cu13"; echo "parts incomplete: carry all three"; exit 3; }
  local wheels=(apache_tvm_ffi nvidia_cutlass_dsl-4 nvidia_cutlass_dsl_libs_base nvidia_cutlass_dsl_libs_core nvidia_cutlass_dsl_libs_cu13)
  "$py" -c 'import cuda.bindings.driver' 2> /dev/null || wheels+=(cuda_bindings cuda_pathfinder)
  "$py" -c 'import einops' 2> /dev/null || wheels+=(einops)
  "$py" -c 'import google.protobuf' 2> /dev/null || wheels+=(protobuf)
  mkdir -p "$site"
  local files=() name file
  for name in "${wheels[@]}"; do
    file=$(ls "$stage/$name"*.whl 2> /dev/null | head -1 || true)
    [ -n "$file" ] || { echo "no $name*.whl in $stage (KP_WHEELS)"; exit 3; }
    files+=("$file")
  done
  # One pip command for them all: the cutlass-dsl wheels share the nvidia_cutlass_dsl/ folder, and one
  # `pip install --target --upgrade` a wheel replaced that folder whole (cutlass.cute went missing on the H200).
  "$py" -m pip install -q --no-deps --no-index --target "$site" --upgrade "${files[@]}"
  echo "installed into $site: ${wheels[*]}"
}

site_env() {  # one place for the exports: the cutlass-dsl wheel's .pth file is not read for a --target install
  echo "export PYTHONPATH=$site:$site/nvidia_cutlass_dsl/dsl_packages:$repo\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export TVM_FFI_CUDA_ARCH_LIST=\${TVM_FFI_CUDA_ARCH_LIST:-9.0}"
}

check() {
  eval "$(site_env)"
  { nvidia-smi --query-gpu=index,name,memory.used,utilization.gpu --format=csv,noheader; nvcc --version | tail -1; } || true
  "$py" "$repo/benchmarks/gpu/new_tasks_check.py" "${1:-all}"
}

case "${1:-all}" in
  upstream) upstream ;;
  stage) stage_wheels ;;
  install) install ;;
  check) check "${2:-all}" ;;
  env) site_env ;;
  all) stage_wheels > /dev/null; install; check "${2:-all}" ;;
  *) echo "usage: $0 upstream | stage | install | check [ROWS] | all [ROWS] | env"; exit 2 ;;
esac
