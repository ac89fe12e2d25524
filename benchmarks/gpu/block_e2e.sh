#!/usr/bin/env bash
# Issue 45 item 4: one Qwen-Image block from the sglang wheel, fuse_scale_shift's candidate mounted at its call site.
#   here:      bash benchmarks/gpu/block_e2e.sh pack      (wheels into .gpustage/e2e/, git-ignored; prints the size)
#   GPU host:  run(command="bash benchmarks/gpu/block_e2e.sh", carry=[".gpustage/e2e"])   (results under $OUT)
set -euo pipefail
STAGE=.gpustage/e2e
WHL=${KP_WHL:-.whl}  # the pinned wheels, as remeasure.sh pack reads them
SGLANG_WHEEL=${SGLANG_WHEEL:-$WHL/sglang/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl}
# What the model import needs and the 'cuda' image lacks (docs/model-context.md, "Item 4"); --no-deps each.
DEPS=(msgspec==0.22.0 pybase64==1.5.1 starlette==1.10.0 diffusers==0.42.1 orjson==3.13.0 pyzmq==27.3.0
      dill==0.4.1 gguf==0.19.0 addict==2.4.0 cache-dit==1.5.3 compressed-tensors==0.20.1 loguru==0.7.3
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      ipython==9.18.1 traitlets==5.16.1)  # IPython's own deps are not imported on this path (seen on CPU)

if [ "${1:-}" = pack ]; then
  rm -rf "$STAGE" && mkdir -p "$STAGE"
  cp "$SGLANG_WHEEL" "$STAGE/"
  cp "$WHL"/apache_tvm_ffi-0.1.15.post2-*.whl "$STAGE/"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$STAGE" "${DEPS[@]}"
  du -sh "$STAGE"; du -sb "$STAGE" | awk '{printf "%.1f MiB\n", $1/1048576}'
  exit 0
fi

[ -d "$STAGE" ] || { echo "block_e2e.sh: $STAGE missing: run 'bash benchmarks/gpu/block_e2e.sh pack' here and carry it" >&2; exit 2; }
OUT=${OUT:?OUT: the folder the device call brings back}
python3 -m pip install -q --no-index --no-deps --target /tmp/e2e-site $(ls "$STAGE"/*.whl | grep -v /sglang-) 2>&1 | tail -3
python3 -c 'import torch, triton, transformers, huggingface_hub as h; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__, "hub", h.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")'
rc=0
python3 benchmarks/gpu/block_e2e.py --wheel "$STAGE"/sglang-0.5.23-*.whl --unpack /tmp/e2e-sglang \
  --site /tmp/e2e-site --out "$OUT" --device cuda --tokens production "$@" > "$OUT/log.txt" 2>&1 || rc=$?
tail -60 "$OUT/log.txt"
exit $rc
