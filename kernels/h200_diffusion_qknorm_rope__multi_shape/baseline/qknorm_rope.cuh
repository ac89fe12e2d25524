// Baseline side: SGLang's QKNormRopeKernel, unchanged, from the pinned upstream file under ./upstream
// (materialized, sha256-checked, by `bash benchmarks/gpu/new_tasks.sh upstream`; docs/baseline_source.md).
//
// The builder's generated unit includes this file and then registers [build] exports at global scope.
// SGLang's load_jit writes the same registration inside `namespace sglang`, where the kernel and the
// dtype names of its template arguments (fp32_t, bf16_t, ...) live; the using-directive below gives the
// registration that same view. Nothing else differs from upstream's generated wrapper.
#pragma once

#include "upstream/sglang/kernels/jit/csrc/diffusion/qknorm_rope.cuh"

using namespace sglang;
