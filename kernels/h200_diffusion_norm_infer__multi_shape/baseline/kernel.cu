// Baseline: a CUDA C++ port of SGLang's diffusion norm_infer (LayerNorm / RMSNorm, inference).
//
// Follows python/sglang/jit_kernel/diffusion/triton/norm.py (sgl-project/sglang, main):
// `norm_infer` and its `_norm_infer_kernel` (the RMS branch has the same arithmetic as
// `triton_one_pass_rms_norm` in rmsnorm_onepass.py). Written for this task from the upstream
// semantics and launch structure: one block per row, 32 * min(max(BLOCK_N / 256, 1), 8) threads
// with BLOCK_N = next_pow2(N), fp32 accumulation, mean then centred variance, rstd = 1 / sqrt(var
// + eps), y = x_hat * w + b. The port reads the row with plain per-element loads and re-reads it
// for each pass (the Triton original keeps it in registers); docs/baseline_source.md says so.
//
// ABI (identical in solution/kernel.cu): norm_infer(x, weight?, bias?, eps, is_rms_norm, out),
// x and out [M, N] with unit column stride, weight/bias [N] of x's dtype or None; out passed in.

#include <torch/extension.h>

// c10's current-stream header rather than ATen/cuda/CUDAContext.h: the same stream
// (at::cuda::getCurrentCUDAStream is c10::cuda's), without the cuBLAS/cuSPARSE headers, so the
// file also compiles against a bare CUDA toolkit (the CI compile check).
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block; every thread gets the total. `scratch` holds one float per warp.
__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from the previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  return total;
}

template <typename T, bool kRms>
__global__ void norm_infer_row_kernel(const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ weight,
                                      const T* __restrict__ bias, int64_t stride_x, int64_t stride_y, int n,
                                      float eps) {
  __shared__ float scratch[kWarp];
  const T* x_row = x + blockIdx.x * stride_x;
  T* y_row = y + blockIdx.x * stride_y;

  float mean = 0.f;
  if (!kRms) {
    float sum = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += static_cast<float>(x_row[i]);
    mean = block_sum(sum, scratch) / n;
  }
  float sq = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float centred = static_cast<float>(x_row[i]) - mean;
    sq += centred * centred;
  }
  const float var = block_sum(sq, scratch) / n;
  const float rstd = 1.f / sqrtf(var + eps);

  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float v = (static_cast<float>(x_row[i]) - mean) * rstd;
    if (weight != nullptr) v *= static_cast<float>(weight[i]);
    if (bias != nullptr) v += static_cast<float>(bias[i]);
    y_row[i] = static_cast<T>(v);
  }
}

int next_pow2(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// The task's dtypes only (AT_DISPATCH_FLOATING_TYPES would also compile a double instance).
template <typename F>
void with_dtype(at::ScalarType dtype, F&& body) {
  switch (dtype) {
    case at::kFloat:
      return body(float{});
    case at::kHalf:
      return body(at::Half{});
    case at::kBFloat16:
      return body(at::BFloat16{});
    default:
      TORCH_CHECK(false, "norm_infer: x must be float32, float16 or bfloat16");
  }
}

void check_vector(const c10::optional<at::Tensor>& t, const at::Tensor& x, const char* name) {
  if (!t.has_value()) return;
  TORCH_CHECK(t->dim() == 1 && t->size(0) == x.size(1), name, " must be [N]");
  TORCH_CHECK(t->stride(0) == 1 && t->scalar_type() == x.scalar_type(), name, " must be contiguous and of x's dtype");
  TORCH_CHECK(t->device() == x.device(), name, " must be on x's device");
}

}  // namespace

void norm_infer(const at::Tensor& x, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                double eps, bool is_rms_norm, const at::Tensor& out) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.stride(1) == 1, "x must be a CUDA [M, N] tensor with unit column stride");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type() && out.stride(1) == 1,
              "out must match x");
  check_vector(weight, x, "weight");
  check_vector(bias, x, "bias");
  const int64_t rows = x.size(0);
  const int n = static_cast<int>(x.size(1));
  const int element_size = static_cast<int>(x.element_size());
  const int block_n = next_pow2(n);
  TORCH_CHECK(n <= 65536 / element_size, "norm_infer: feature dim >= 64KB is not supported (as upstream)");
  if (rows == 0 || n == 0) return;

  const int warps = std::min(std::max(block_n / 256, 1), 8);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  with_dtype(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* w = weight.has_value() ? weight->data_ptr<scalar_t>() : nullptr;
    const scalar_t* b = bias.has_value() ? bias->data_ptr<scalar_t>() : nullptr;
    const auto launch = [&](auto kernel) {
      kernel<<<static_cast<unsigned>(rows), warps * kWarp, 0, stream>>>(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), w, b, x.stride(0), out.stride(0), n,
          static_cast<float>(eps));
    };
    if (is_rms_norm) {
      launch(norm_infer_row_kernel<scalar_t, true>);
    } else {
      launch(norm_infer_row_kernel<scalar_t, false>);
    }
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_infer", &norm_infer, "LayerNorm / RMSNorm inference into out", py::arg("x"), py::arg("weight"),
        py::arg("bias"), py::arg("eps"), py::arg("is_rms_norm"), py::arg("out"));
}
