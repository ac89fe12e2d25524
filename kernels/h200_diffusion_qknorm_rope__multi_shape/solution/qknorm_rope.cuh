// Candidate: fused in-place QK RMSNorm + RoPE for diffusion attention.
//
// Same entry point and template parameters as SGLang's QKNormRopeKernel<...>::run, so the one
// registration in task.toml's [build] exports serves both sides. What differs is the work split:
//   - one row (one head of one token) is head_dim / 8 lanes, each lane one 16-byte vector;
//   - a group of those lanes takes kRowsPerGroup heads of ONE token: the token's position and
//     its cos/sin are loaded once and reused for every head, and the group's row loads are all
//     issued before any arithmetic (kRowsPerGroup x 16 B in flight per lane);
//   - a plain grid, one work item per group, no persistent loop.
// Numerics follow the upstream kernel: fp32 sum of squares, rsqrt(mean + eps), x * factor * w;
// with kRoundNormBeforeRope the normed value is rounded to the activation dtype and each RoPE
// product is rounded on its own (no contraction), as upstream does with an fp32 cache.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <type_traits>

using fp32_t = float;
using fp16_t = __half;
using bf16_t = __nv_bfloat16;

namespace {

namespace qkr {

constexpr uint32_t kThreads = 256;
constexpr uint32_t kElemsPerLane = 8;  // 8 x 16-bit = one 16-byte vector
constexpr uint32_t kRowsPerGroup = 4;

struct Params {
  char* q;
  char* k;
  const char* q_weight;
  const char* k_weight;
  const float* cos_sin_cache;
  const void* positions;
  int64_t q_token_stride;  // bytes
  int64_t k_token_stride;  // bytes
  int64_t head_stride;     // bytes, the same for q and k
  uint32_t num_q_heads;
  uint32_t num_heads;  // q heads + k heads
  uint32_t chunks_per_token;
  uint32_t num_works;  // tokens * chunks_per_token
  float eps;
};

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return __bfloat162float(v);
  } else {
    return __half2float(v);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    return __float2bfloat16_rn(v);
  } else {
    return __float2half_rn(v);
  }
}

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

template <typename T>
__device__ __forceinline__ void unpack(const uint4& raw, float (&out)[kElemsPerLane]) {
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (uint32_t i = 0; i < kElemsPerLane; ++i) out[i] = to_float(v[i]);
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float (&in)[kElemsPerLane]) {
  uint4 raw;
  T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (uint32_t i = 0; i < kElemsPerLane; ++i) v[i] = from_float<T>(in[i]);
  return raw;
}

__device__ __forceinline__ void load8(const float* ptr, float (&out)[kElemsPerLane]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(ptr));
  const float4 b = __ldg(reinterpret_cast<const float4*>(ptr) + 1);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = a.z;
  out[3] = a.w;
  out[4] = b.x;
  out[5] = b.y;
  out[6] = b.z;
  out[7] = b.w;
}

template <
    int64_t kHeadDim,
    int64_t kRopeDim,
    bool kIsNeox,
    typename DType,
    bool kRound,
    bool kFullWidth,
    typename IdType>
__global__ void __launch_bounds__(kThreads) qknorm_rope_kernel(const Params p) {
  constexpr uint32_t kLanes = kHeadDim / kElemsPerLane;  // lanes per row: 8, 16 or 32
  constexpr uint32_t kGroupsPerBlock = kThreads / kLanes;
  constexpr uint32_t kRotaryLanes = kRopeDim / kElemsPerLane;
  constexpr uint32_t kHalfRotaryLanes = kRotaryLanes / 2;
  constexpr int64_t kCacheWidth = kFullWidth ? 2 * kRopeDim : kRopeDim;
  constexpr int64_t kSinOffset = kFullWidth ? kRopeDim : kRopeDim / 2;

  const uint32_t lane = threadIdx.x % kLanes;
  const uint32_t group_base = (threadIdx.x % 32) - lane;  // first warp lane of this group
  const uint32_t work = blockIdx.x * kGroupsPerBlock + threadIdx.x / kLanes;
  const bool has_work = work < p.num_works;
  const uint32_t token = has_work ? work / p.chunks_per_token : 0;
  const uint32_t head0 = has_work ? (work % p.chunks_per_token) * kRowsPerGroup : p.num_heads;

  // 1. every row load of this group first, then both weights
  uint4 raw[kRowsPerGroup];
#pragma unroll
  for (uint32_t r = 0; r < kRowsPerGroup; ++r) {
    const uint32_t head = head0 + r;
    raw[r] = make_uint4(0u, 0u, 0u, 0u);
    if (head < p.num_heads) {
      const char* row = head < p.num_q_heads
                            ? p.q + token * p.q_token_stride + head * p.head_stride
                            : p.k + token * p.k_token_stride + (head - p.num_q_heads) * p.head_stride;
      raw[r] = __ldg(reinterpret_cast<const uint4*>(row) + lane);
    }
  }
  float wq[kElemsPerLane];
  float wk[kElemsPerLane];
  unpack<DType>(__ldg(reinterpret_cast<const uint4*>(p.q_weight) + lane), wq);
  unpack<DType>(__ldg(reinterpret_cast<const uint4*>(p.k_weight) + lane), wk);

  // 2. this token's cos/sin for this lane's elements, once for all the group's rows
  float cos_v[kElemsPerLane];
  float sin_v[kElemsPerLane];
  if (has_work && lane < kRotaryLanes) {
    const int64_t pos = static_cast<int64_t>(static_cast<const IdType*>(p.positions)[token]);
    const float* cos_row = p.cos_sin_cache + pos * kCacheWidth;
    const float* sin_row = cos_row + kSinOffset;
    if constexpr (kFullWidth || kIsNeox) {
      // this lane's 8 entries are contiguous: full width at e, NeoX half width at e % (rope/2)
      uint32_t c0 = lane * kElemsPerLane;
      if constexpr (!kFullWidth) c0 = (lane % kHalfRotaryLanes) * kElemsPerLane;
      load8(cos_row + c0, cos_v);
      load8(sin_row + c0, sin_v);
    } else {
      // interleaved pairs (2j, 2j + 1) share entry j: 4 entries, each used twice
      const float4 c = __ldg(reinterpret_cast<const float4*>(cos_row + lane * kElemsPerLane / 2));
      const float4 s = __ldg(reinterpret_cast<const float4*>(sin_row + lane * kElemsPerLane / 2));
      cos_v[0] = cos_v[1] = c.x;
      cos_v[2] = cos_v[3] = c.y;
      cos_v[4] = cos_v[5] = c.z;
      cos_v[6] = cos_v[7] = c.w;
      sin_v[0] = sin_v[1] = s.x;
      sin_v[2] = sin_v[3] = s.y;
      sin_v[4] = sin_v[5] = s.z;
      sin_v[6] = sin_v[7] = s.w;
    }
  } else {
#pragma unroll
    for (uint32_t i = 0; i < kElemsPerLane; ++i) {
      cos_v[i] = 1.0f;
      sin_v[i] = 0.0f;
    }
  }

  // NeoX partner: element e < rope/2 pairs with e + rope/2, kHalfRotaryLanes lanes away
  uint32_t partner = lane;
  if constexpr (kIsNeox) {
    if (lane < kHalfRotaryLanes) {
      partner = lane + kHalfRotaryLanes;
    } else if (lane < kRotaryLanes) {
      partner = lane - kHalfRotaryLanes;
    }
  }

#pragma unroll
  for (uint32_t r = 0; r < kRowsPerGroup; ++r) {
    const uint32_t head = head0 + r;
    const bool is_q = head < p.num_q_heads;
    float x[kElemsPerLane];
    unpack<DType>(raw[r], x);

    // 3. RMS norm over the row's kLanes lanes (every lane of the warp takes part)
    float sum_sq = 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < kElemsPerLane; ++i) sum_sq += x[i] * x[i];
#pragma unroll
    for (uint32_t mask = kLanes / 2; mask >= 1; mask >>= 1) {
      sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, mask);
    }
    const float factor = rsqrtf(sum_sq / static_cast<float>(kHeadDim) + p.eps);
#pragma unroll
    for (uint32_t i = 0; i < kElemsPerLane; ++i) {
      x[i] = x[i] * factor * (is_q ? wq[i] : wk[i]);
      if constexpr (kRound) x[i] = round_to<DType>(x[i]);
    }

    // 4. RoPE on the first kRopeDim elements
    if constexpr (kIsNeox) {
      float other[kElemsPerLane];
#pragma unroll
      for (uint32_t i = 0; i < kElemsPerLane; ++i) {
        other[i] = __shfl_sync(0xffffffffu, x[i], group_base + partner);
      }
      if (lane < kRotaryLanes) {
        const bool lower = lane < kHalfRotaryLanes;
#pragma unroll
        for (uint32_t i = 0; i < kElemsPerLane; ++i) {
          const float y = lower ? -other[i] : other[i];
          if constexpr (kRound) {
            x[i] = __fadd_rn(__fmul_rn(x[i], cos_v[i]), __fmul_rn(y, sin_v[i]));
          } else {
            x[i] = x[i] * cos_v[i] + y * sin_v[i];
          }
        }
      }
    } else if (lane < kRotaryLanes) {
#pragma unroll
      for (uint32_t i = 0; i < kElemsPerLane; i += 2) {
        const float a = x[i];
        const float b = x[i + 1];
        if constexpr (kRound) {
          x[i] = __fadd_rn(__fmul_rn(a, cos_v[i]), __fmul_rn(-b, sin_v[i]));
          x[i + 1] = __fadd_rn(__fmul_rn(b, cos_v[i + 1]), __fmul_rn(a, sin_v[i + 1]));
        } else {
          x[i] = a * cos_v[i] - b * sin_v[i];
          x[i + 1] = b * cos_v[i + 1] + a * sin_v[i + 1];
        }
      }
    }

    if (head < p.num_heads) {
      char* row = is_q ? p.q + token * p.q_token_stride + head * p.head_stride
                       : p.k + token * p.k_token_stride + (head - p.num_q_heads) * p.head_stride;
      reinterpret_cast<uint4*>(row)[lane] = pack<DType>(x);
    }
  }
}

inline bool is_dtype(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

template <typename DType>
constexpr uint8_t dl_code() {
  return std::is_same_v<DType, bf16_t> ? static_cast<uint8_t>(kDLBfloat) : static_cast<uint8_t>(kDLFloat);
}

}  // namespace qkr

}  // namespace

// The template parameters are upstream's, in upstream's order; kUsePDL and kAllowHalfWarp
// are accepted and unused (this kernel is launched without PDL).
template <
    int64_t kHeadDim,
    int64_t kRopeDim,
    bool kIsNeox,
    bool kUsePDL,
    typename DType,
    typename CacheDType,
    bool kRoundNormBeforeRope,
    bool kCacheHasFullWidth,
    bool kAllowHalfWarp = true>
struct QKNormRopeKernel {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim must be 64, 128 or 256");
  static_assert(std::is_same_v<DType, bf16_t> || std::is_same_v<DType, fp16_t>, "bf16 or fp16 activations");
  static_assert(std::is_same_v<CacheDType, fp32_t>, "this candidate takes an fp32 cos/sin cache");
  static_assert(kRopeDim > 0 && kRopeDim <= kHeadDim, "0 < rope_dim <= head_dim");
  static_assert(kRopeDim % (kIsNeox ? 16 : 8) == 0, "rope_dim must end on a 16-byte lane (NeoX: both halves)");

  static void
  run(const tvm::ffi::TensorView q,
      const tvm::ffi::TensorView k,
      const tvm::ffi::TensorView q_weight,
      const tvm::ffi::TensorView k_weight,
      const tvm::ffi::TensorView cos_sin_cache,
      const tvm::ffi::TensorView positions,
      float eps) {
    using namespace qkr;
    constexpr uint8_t kCode = dl_code<DType>();
    TVM_FFI_CHECK(q.ndim() == 3 && k.ndim() == 3, ValueError) << "q and k must be [tokens, heads, head_dim]";
    TVM_FFI_CHECK(q.size(2) == kHeadDim && k.size(2) == kHeadDim, ValueError) << "head_dim mismatch";
    TVM_FFI_CHECK(q.size(0) == k.size(0), ValueError) << "q and k token counts differ";
    TVM_FFI_CHECK(q.stride(2) == 1 && k.stride(2) == 1, ValueError) << "head_dim must be contiguous";
    TVM_FFI_CHECK(q.stride(1) == k.stride(1), ValueError) << "q and k head strides differ";
    TVM_FFI_CHECK(is_dtype(q.dtype(), kCode, 16) && is_dtype(k.dtype(), kCode, 16), TypeError) << "q/k dtype";
    TVM_FFI_CHECK(is_dtype(q_weight.dtype(), kCode, 16) && is_dtype(k_weight.dtype(), kCode, 16), TypeError)
        << "weight dtype";
    TVM_FFI_CHECK(q_weight.numel() == kHeadDim && k_weight.numel() == kHeadDim, ValueError) << "weight size";
    TVM_FFI_CHECK(is_dtype(cos_sin_cache.dtype(), kDLFloat, 32), TypeError) << "cos_sin_cache must be float32";
    TVM_FFI_CHECK(cos_sin_cache.ndim() == 2 && cos_sin_cache.size(1) == (kCacheHasFullWidth ? 2 : 1) * kRopeDim,
                  ValueError)
        << "cos_sin_cache width";
    TVM_FFI_CHECK(cos_sin_cache.stride(1) == 1 && cos_sin_cache.stride(0) == cos_sin_cache.size(1), ValueError)
        << "cos_sin_cache must be contiguous";
    TVM_FFI_CHECK(positions.ndim() == 1 && positions.size(0) == q.size(0), ValueError) << "positions length";
    const bool ids32 = is_dtype(positions.dtype(), kDLInt, 32);
    TVM_FFI_CHECK(ids32 || is_dtype(positions.dtype(), kDLInt, 64), TypeError) << "positions must be int32/int64";

    const auto num_tokens = static_cast<uint32_t>(q.size(0));
    const auto num_q_heads = static_cast<uint32_t>(q.size(1));
    const auto num_heads = num_q_heads + static_cast<uint32_t>(k.size(1));
    if (num_tokens == 0 || num_heads == 0) return;

    Params p;
    p.q = static_cast<char*>(q.data_ptr());
    p.k = static_cast<char*>(k.data_ptr());
    p.q_weight = static_cast<const char*>(q_weight.data_ptr());
    p.k_weight = static_cast<const char*>(k_weight.data_ptr());
    p.cos_sin_cache = static_cast<const float*>(cos_sin_cache.data_ptr());
    p.positions = positions.data_ptr();
    p.q_token_stride = q.stride(0) * static_cast<int64_t>(sizeof(DType));
    p.k_token_stride = k.stride(0) * static_cast<int64_t>(sizeof(DType));
    p.head_stride = q.stride(1) * static_cast<int64_t>(sizeof(DType));
    p.num_q_heads = num_q_heads;
    p.num_heads = num_heads;
    p.chunks_per_token = (num_heads + kRowsPerGroup - 1) / kRowsPerGroup;
    p.num_works = num_tokens * p.chunks_per_token;
    p.eps = eps;

    constexpr uint32_t kGroupsPerBlock = kThreads / (kHeadDim / kElemsPerLane);
    const uint32_t blocks = (p.num_works + kGroupsPerBlock - 1) / kGroupsPerBlock;
    const DLDevice device = q.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    if (ids32) {
      qknorm_rope_kernel<kHeadDim, kRopeDim, kIsNeox, DType, kRoundNormBeforeRope, kCacheHasFullWidth, int32_t>
          <<<blocks, kThreads, 0, stream>>>(p);
    } else {
      qknorm_rope_kernel<kHeadDim, kRopeDim, kIsNeox, DType, kRoundNormBeforeRope, kCacheHasFullWidth, int64_t>
          <<<blocks, kThreads, 0, stream>>>(p);
    }
    const cudaError_t err = cudaGetLastError();
    TVM_FFI_CHECK(err == cudaSuccess, RuntimeError) << "qknorm_rope launch: " << cudaGetErrorString(err);
  }
};
