// Matmuls on the standard packed 4-bit layout (semantics: gemv_4bit / gemm_4bit in
// bitsandbytes/_reference/fourbit.py). W[n, k] is the weight at flat index f = n * K + k: its code is the
// high nibble of byte f / 2 for even f, the low nibble for odd f, its scale absmax[f / blocksize], its
// value code_table[code] * scale in fp32. No repacking: any N and K (odd K starts rows mid-byte).
//
// gemv_4bit: out[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) for few rows of A (decoding). A block
//   computes kGemvFeatures output features for up to kGemvMaxRows rows of A (gridDim.y tiles M); its
//   threads split K, so each weight is read once and each value of A loaded once per block is used for
//   every feature (register blocking: kGemvFeatures x kGemvMaxRows fp32 accumulators per thread).
//   Weights are the reference's fp32 values table[code] * absmax (16-entry table in shared memory: 16
//   words in 16 banks, no conflicts), accumulated with fmaf; then a butterfly reduction per warp and a
//   fixed-order sum over the warps in shared memory. VEC (K % 8 == 0, A 16-byte and B 4-byte aligned):
//   thread t takes 8-weight chunks t, t + 128, ... of each feature row, one 4-byte load per row (a warp
//   reads 128 contiguous bytes of each row) and 16-byte loads of A; a chunk never straddles a block
//   (blocksize >= 32, powers of two), so one scale per chunk. Otherwise (K % 8 != 0: rows start
//   mid-byte or mid-chunk; misaligned views) thread t takes weights t, t + 128, ... one by one.
// dequantize_4bit_weight: W (flat, n values) rounded to T, for the many-rows path (the op multiplies it
//   with torch). 8 values per thread, one 16-byte store (fp16/bf16) or two (fp32).
// expand_nested_absmax: double-quantized block scales back to fp32, code8[q[j]] * absmax2[j / 256] +
//   offset, two roundings exactly as the reference (no FMA contraction).
#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul_4bit.cuh"

constexpr int kGemvWarps = 4;     // warps per block; the block's threads split K
constexpr int kGemvFeatures = 4;  // output features per block; gridDim.x = ceil(N / kGemvFeatures)
constexpr int kGemvMaxRows = 8;   // rows of A per block; gridDim.y = ceil(M / kGemvMaxRows)
constexpr int kGemvChunk = 8;     // weights per thread, feature and step on the VEC path (4 bytes)
constexpr int kDequantPerThread = 8;

template <typename T, bool VEC>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_4bit(const T* __restrict__ A, const unsigned char* __restrict__ B, const float* __restrict__ absmax,
              const float* __restrict__ code, const T* __restrict__ bias, T* __restrict__ out, long long M, long long N,
              long long K, int blocksize) {
  using namespace bnb_matmul_4bit;
  constexpr int kThreads = kGemvWarps * 32;
  constexpr int F = kGemvFeatures;
  constexpr int R = kGemvMaxRows;
  __shared__ float table[16];
  __shared__ float partial[kGemvWarps][F * R];
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  __syncthreads();

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const long long n0 = static_cast<long long>(blockIdx.x) * F;
  const long long m0 = static_cast<long long>(blockIdx.y) * R;
  const int feats = static_cast<int>(N - n0 < F ? N - n0 : F);  // the same for the whole block
  const int rows = static_cast<int>(M - m0 < R ? M - m0 : R);
  const int shift = __ffs(blocksize) - 1;
  const T* a0 = A + m0 * K;

  float acc[F][R];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[f][r] = 0.0f;

  if (VEC) {
#pragma unroll 2
    for (long long k = threadIdx.x * static_cast<long long>(kGemvChunk); k < K; k += kThreads * kGemvChunk) {
      float w[F][kGemvChunk];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        if (f < feats) {
          const long long base = (n0 + f) * K + k;  // a multiple of 8: 4 aligned bytes, one block
          const unsigned int q = __ldg(reinterpret_cast<const unsigned int*>(B + (base >> 1)));
          const float s = __ldg(absmax + (base >> shift));
#pragma unroll
          for (int j = 0; j < kGemvChunk / 2; ++j) {  // byte j of a little-endian word is byte j in memory
            const unsigned int byte = (q >> (8 * j)) & 0xFFu;
            w[f][2 * j] = table[byte >> 4] * s;
            w[f][2 * j + 1] = table[byte & 15u] * s;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          float a[kGemvChunk];
          load_floats<T, kGemvChunk>(a0 + r * K + k, a);
#pragma unroll
          for (int f = 0; f < F; ++f)
            if (f < feats)
#pragma unroll
              for (int j = 0; j < kGemvChunk; ++j) acc[f][r] = fmaf(w[f][j], a[j], acc[f][r]);
        }
      }
    }
  } else {
    for (long long k = threadIdx.x; k < K; k += kThreads) {
      float w[F];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        if (f < feats) {
          const long long i = (n0 + f) * K + k;
          w[f] = table[code_at(B, i)] * __ldg(absmax + (i >> shift));
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          const float a = to_float(a0[r * K + k]);
#pragma unroll
          for (int f = 0; f < F; ++f)
            if (f < feats) acc[f][r] = fmaf(w[f], a, acc[f][r]);
        }
      }
    }
  }

  // Per warp: a butterfly sum of each (feature, row); lane 0 leaves them in shared memory.
#pragma unroll
  for (int f = 0; f < F; ++f) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (f < feats && r < rows) {  // uniform over the block
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) acc[f][r] += __shfl_xor_sync(0xFFFFFFFFu, acc[f][r], offset);
        if (lane == 0) partial[warp][r * F + f] = acc[f][r];
      }
    }
  }
  __syncthreads();
  // Thread t = r * F + f sums the warps in a fixed order: consecutive threads write consecutive features.
  const int t = threadIdx.x;
  if (t < F * R) {
    const int f = t % F, r = t / F;
    if (f < feats && r < rows) {
      float v = partial[0][t];
#pragma unroll
      for (int w = 1; w < kGemvWarps; ++w) v += partial[w][t];
      if (bias != nullptr) v += to_float(bias[n0 + f]);
      out[(m0 + r) * N + n0 + f] = from_float<T>(v);
    }
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
