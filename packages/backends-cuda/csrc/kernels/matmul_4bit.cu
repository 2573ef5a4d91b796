// Matmuls on the standard packed 4-bit layout (semantics: gemv_4bit / gemm_4bit in
// bitsandbytes/_reference/fourbit.py). W[n, k] is the weight at flat index f = n * K + k: its code is the
// high nibble of byte f / 2 for even f, the low nibble for odd f, its scale absmax[f / blocksize], its
// value code_table[code] * scale in fp32. No repacking: any N and K (odd K starts rows mid-byte).
//
// gemv_4bit: out[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) for few rows of A (decoding). One warp per
//   output feature n streams its weight row once, for up to kGemvMaxRows rows of A at a time (gridDim.y
//   tiles M), fp32 accumulation with fmaf, then a butterfly reduction over the warp. VEC (K % 32 == 0,
//   16-byte aligned A and B): each lane takes 32 weights (16 bytes, one load) per step, a warp 512
//   contiguous bytes; a 32-weight chunk never straddles a block (blocksize >= 32, powers of two), so one
//   scale per chunk. Otherwise lane k takes weights k, k + 32, ... one by one (odd K, misaligned views).
// dequantize_4bit_weight: W (flat, n values) rounded to T, for the many-rows path (the op multiplies it
//   with torch). 8 values per thread, one 16-byte store (fp16/bf16) or two (fp32).
// expand_nested_absmax: double-quantized block scales back to fp32, code8[q[j]] * absmax2[j / 256] +
//   offset, two roundings exactly as the reference (no FMA contraction).
#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul_4bit.cuh"

constexpr int kGemvWarps = 4;    // output features (one per warp) per block
constexpr int kGemvMaxRows = 8;  // rows of A per block; gridDim.y = ceil(M / kGemvMaxRows)
constexpr int kDequantPerThread = 8;

template <typename T, bool VEC>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_4bit(const T* __restrict__ A, const unsigned char* __restrict__ B, const float* __restrict__ absmax,
              const float* __restrict__ code, const T* __restrict__ bias, T* __restrict__ out, long long M, long long N,
              long long K, int blocksize) {
  using namespace bnb_matmul_4bit;
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const long long n = static_cast<long long>(blockIdx.x) * kGemvWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps only, and no barrier follows
  const long long m0 = static_cast<long long>(blockIdx.y) * kGemvMaxRows;
  const int rows = static_cast<int>(M - m0 < kGemvMaxRows ? M - m0 : kGemvMaxRows);
  const int shift = __ffs(blocksize) - 1;
  const long long base = n * K;
  const T* a0 = A + m0 * K;

  float acc[kGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) acc[r] = 0.0f;

  if (VEC) {
    const unsigned char* row = B + (base >> 1);
#pragma unroll 2
    for (long long k = lane * 32LL; k < K; k += 32LL * 32) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(row + (k >> 1)));
      const float s = __ldg(absmax + ((base + k) >> shift));
      const unsigned int words[4] = {q.x, q.y, q.z, q.w};
      float w[32];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // byte j of a little-endian word is byte 4 * i + j in memory
          const unsigned int byte = (words[i] >> (8 * j)) & 0xFFu;
          w[8 * i + 2 * j] = table[byte >> 4] * s;
          w[8 * i + 2 * j + 1] = table[byte & 15u] * s;
        }
      }
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r < rows) {
          float a[32];
          load_floats<T, 32>(a0 + r * K + k, a);
#pragma unroll
          for (int j = 0; j < 32; ++j) acc[r] = fmaf(w[j], a[j], acc[r]);
        }
      }
    }
  } else {
    for (long long k = lane; k < K; k += 32) {
      const long long f = base + k;
      const float w = table[code_at(B, f)] * __ldg(absmax + (f >> shift));
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r)
        if (r < rows) acc[r] = fmaf(w, to_float(a0[r * K + k]), acc[r]);
    }
  }

#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r < rows) {  // rows is the same for the whole warp
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1) acc[r] += __shfl_xor_sync(0xFFFFFFFFu, acc[r], offset);
    }
  }
  if (lane < rows) {  // lane r writes row r: the warp's stores go out together
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < kGemvMaxRows; ++r)
      if (lane == r) v = acc[r];
    if (bias != nullptr) v += to_float(bias[n]);
    out[(m0 + lane) * N + n] = from_float<T>(v);
  }
}

template <typename T>
__global__ void dequantize_4bit_weight(const unsigned char* __restrict__ B, const float* __restrict__ absmax,
                                       const float* __restrict__ code, T* __restrict__ out, long long n,
                                       int blocksize) {
  using namespace bnb_matmul_4bit;
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  __syncthreads();

  const long long i0 = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kDequantPerThread;
  if (i0 >= n) return;
  const int shift = __ffs(blocksize) - 1;
  if (i0 + kDequantPerThread <= n) {
    // i0 is a multiple of 8 and blocks hold >= 32 values: one scale for all eight.
    const float s = __ldg(absmax + (i0 >> shift));
    float v[kDequantPerThread];
#pragma unroll
    for (int j = 0; j < kDequantPerThread / 2; ++j) {
      const unsigned int byte = __ldg(B + (i0 >> 1) + j);
      v[2 * j] = table[byte >> 4] * s;
      v[2 * j + 1] = table[byte & 15u] * s;
    }
    store_floats<T, kDequantPerThread>(out + i0, v);  // out is a fresh allocation: 16-byte aligned
  } else {
    for (long long f = i0; f < n; ++f) out[f] = from_float<T>(table[code_at(B, f)] * __ldg(absmax + (f >> shift)));
  }
}

__global__ void expand_nested_absmax(const unsigned char* __restrict__ q, const float* __restrict__ absmax2,
                                     const float* __restrict__ code8, const float* __restrict__ offset,
                                     float* __restrict__ out, long long n) {
  const long long j = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  out[j] = __fadd_rn(__fmul_rn(code8[q[j]], absmax2[j / BNB_DOUBLE_QUANT_BLOCKSIZE]), offset[0]);
}
