// The side's one translation unit: what SGLang's load_jit generates for a cuda wrapper
// (the tvm-ffi headers, the kernel header, one TVM_FFI_DLL_EXPORT_TYPED_FUNC inside
// namespace sglang). The builder writes the row's template arguments into kp_template_args.h
// (`#define KP_TEMPLATE_ARGS 128, 128, false, ...`) in the build folder, which is on the include
// path; a -D flag cannot carry them, since nvcc splits -D values at commas.
// baseline/export.cu is this file with the upstream header instead of ./qknorm_rope.cuh.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/dtype.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "qknorm_rope.cuh"

#include "kp_template_args.h"

namespace sglang {
TVM_FFI_DLL_EXPORT_TYPED_FUNC(qknorm_rope, (QKNormRopeKernel<KP_TEMPLATE_ARGS>::run));
}  // namespace sglang
