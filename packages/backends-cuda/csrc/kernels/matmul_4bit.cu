// Matmuls on the standard packed 4-bit layout (semantics: gemv_4bit / gemm_4bit in
// bitsandbytes/_reference/fourbit.py). W[n, k] is the weight at flat index f = n * K + k: its code is the
// high nibble of byte f / 2 for even f, the low nibble for odd f, its scale absmax[f / blocksize], its
// value code_table[code] * scale in fp32. No repacking: any N and K (odd K starts rows mid-byte).
//
// Block scales: plain (fp32, one per block) or double-quantized (absmax_8bit != null): the scale of
// block b is code8[absmax_8bit[b]] * absmax[b / 256] + offset, an fp32 product then an fp32 sum, each
// rounded (the reference's dequantize_blockwise followed by "+ offset"; no FMA contraction), computed
// where the kernel loads the scale instead of by a separate pass over all scales.
//
// gemv_4bit<T, CB, MR>: out[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n]) for up to MR rows of A per
//   block (a tile of rows; 1, 2, 4 or 8: decoding and small batches). A warp owns kGemvWarpFeatures<MR>
//   output features and splits K among its lanes; there is no shared memory and no block barrier, so a
//   warp's first weight loads are its first instructions, and the loads of step s + 1 are issued before
//   step s is decoded (two steps of B in flight per warp). The 16-entry code table lives in registers:
//   lane i holds code[i % 16] and a weight is decoded with one shuffle from the lane of its nibble.
//   Weights are the reference's fp32 values, multiplied into fp32 accumulators with fmaf; a butterfly
//   sum per warp ends it. CB = bytes of B per lane and chunk: 16 (K % 32 == 0, B 16-byte aligned: one
//   16-byte load, 32 weights, a warp reads 512 contiguous bytes of a row) or 4 (K % 8 == 0, B 4-byte
//   aligned: 8 weights); A 16-byte aligned, read in 16-byte vectors. A chunk never straddles a block of
//   scales (chunks start at multiples of 2 * CB <= 32 <= blocksize, both powers of two), so one scale per
//   chunk. CB = 0: any shape and alignment, lanes take weights one by one.
//   Grid: 1-D, block x = feature group * row tiles + row tile, so the blocks that read the same weights
//   (one per tile of MR rows) run next to each other and all but the first read them from L2.
// dequantize_4bit_weight: W (flat, n values) rounded to T, for the many-rows path (the op multiplies it
//   with torch). 8 values per thread, one 16-byte store (fp16/bf16) or two (fp32).
#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "matmul_4bit.cuh"

constexpr int kGemvWarps = 4;  // warps per block
// Blocks of 4 warps per SM asked of ptxas (__launch_bounds__' second argument: a register cap of
// 65536 / (128 * blocks)). Left alone it spends up to 96 registers on the one-row kernels, and decoding
// is latency bound: it needs warps and loads in flight, not registers. 8 blocks (64 registers, 32 warps
// per SM; the former kernel's 124 left 16) for tiles of 1, 2 and 4 rows; 6 (85) for tiles of 8, whose 8
// accumulators per feature spill under 64. With nvcc 13 no instantiation spills on sm_80, sm_90 or
// sm_120; tests/test_registers.py holds the one-row ones to that.
template <int MR>
constexpr int kGemvMinBlocks = MR >= 8 ? 6 : 8;
constexpr int kDequantPerThread = 8;

// Output features per warp: two for one row (each value of A loaded serves both: half the L1 traffic of A,
// which is 4x the bytes of B per weight at fp16), one for tiles of rows (their rows reuse each decoded
// weight instead, and two features' pipelined loads and accumulators would not fit in 64 registers).
template <int MR>
constexpr int kGemvWarpFeatures = MR >= 2 ? 1 : 2;

template <typename T, int CB, int MR>
__global__ void __launch_bounds__(kGemvWarps * 32, kGemvMinBlocks<MR>)
    gemv_4bit(const T* __restrict__ A, const unsigned char* __restrict__ B, const float* __restrict__ absmax,
              const unsigned char* __restrict__ absmax_8bit, const float* __restrict__ absmax_code,
              const float* __restrict__ absmax_offset, const float* __restrict__ code, const T* __restrict__ bias,
              T* __restrict__ out, long long M, long long N, long long K, int blocksize) {
  using namespace bnb_matmul_4bit;
  constexpr int F = kGemvWarpFeatures<MR>;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int tiles = static_cast<int>((M + MR - 1) / MR);
  const int tile = static_cast<int>(blockIdx.x % tiles);
  const long long n0 = (static_cast<long long>(blockIdx.x / tiles) * kGemvWarps + warp) * F;
  if (n0 >= N) return;  // a whole warp: nothing below synchronizes the block
  const int feats = static_cast<int>(N - n0 < F ? N - n0 : F);
  const long long m0 = static_cast<long long>(tile) * MR;
  const int rows = static_cast<int>(M - m0 < MR ? M - m0 : MR);
  const int k_len = static_cast<int>(K);
  const T* a0 = A + m0 * K;
  const Scales scales{absmax, absmax_8bit, absmax_code, __ffs(blocksize) - 1};
  const float lut = __ldg(code + (lane & 15));
  const float offset = absmax_8bit != nullptr ? __ldg(absmax_offset) : 0.0f;

  float acc[F][MR];
#pragma unroll
  for (int f = 0; f < F; ++f)
#pragma unroll
    for (int r = 0; r < MR; ++r) acc[f][r] = 0.0f;

  if constexpr (CB > 0) {
    constexpr int kW = 2 * CB;          // weights per lane and chunk
    constexpr int kP = 16 / sizeof(T);  // elements of A per 16-byte load: a piece
    constexpr int kWords = CB / 4;
    // Software pipelined: the weights and scales of the next step are requested before this step's are
    // decoded, so each warp keeps two steps of loads in flight (decoding is latency bound).
    unsigned int q[F][kWords];
    float s[F];
    const auto fetch = [&](int k, unsigned int (&qq)[F][kWords], float (&ss)[F]) {
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const long long base = (n0 + f) * K + k;
        const bool live = k < k_len && f < feats;
        // Tiles of 1, 2 or 4 rows only ever run as a single tile (ops/matmul_4bit.py gemv_tile).
        load_words<CB, (MR < 8)>(B + (base >> 1), live, qq[f]);
        ss[f] = live ? scales.at(base, offset) : 0.0f;
      }
    };
    fetch(lane * kW, q, s);
#pragma unroll 1
    for (int k0 = 0; k0 < k_len; k0 += 32 * kW) {  // uniform over the warp: every lane reaches the shuffles
      const int k = k0 + lane * kW;
      const bool ok = k < k_len;
      unsigned int qn[F][kWords];
      float sn[F];
      fetch(k + 32 * kW, qn, sn);
#pragma unroll
      for (int p = 0; p < kW / kP; ++p) {
        float w[F][kP];
#pragma unroll
        for (int f = 0; f < F; ++f)
#pragma unroll
          for (int j = 0; j < kP / 2; ++j) {
            const int b = p * (kP / 2) + j;  // byte b of the chunk: byte b % 4 of little-endian word b / 4
            const unsigned int byte = (q[f][b / 4] >> (8 * (b % 4))) & 0xFFu;
            w[f][2 * j] = __shfl_sync(0xFFFFFFFFu, lut, static_cast<int>(byte >> 4)) * s[f];
            w[f][2 * j + 1] = __shfl_sync(0xFFFFFFFFu, lut, static_cast<int>(byte & 15u)) * s[f];
          }
        if (ok) {
#pragma unroll
          for (int r = 0; r < MR; ++r) {
            if (r < rows) {
              float a[kP];
              load_floats<T, kP>(a0 + r * K + k + p * kP, a);
#pragma unroll
              for (int f = 0; f < F; ++f)
#pragma unroll
                for (int j = 0; j < kP; ++j) acc[f][r] = fmaf(w[f][j], a[j], acc[f][r]);
            }
          }
        }
      }
#pragma unroll
      for (int f = 0; f < F; ++f) {
        s[f] = sn[f];
#pragma unroll
        for (int i = 0; i < kWords; ++i) q[f][i] = qn[f][i];
      }
    }
  } else {
    for (int k0 = 0; k0 < k_len; k0 += 32) {
      const int k = k0 + lane;
      const bool ok = k < k_len;
      float w[F];
#pragma unroll
      for (int f = 0; f < F; ++f) {
        const long long i = (n0 + f) * K + k;
        const bool live = ok && f < feats;
        const int c = live ? code_at(B, i) : 0;
        w[f] = __shfl_sync(0xFFFFFFFFu, lut, c) * (live ? scales.at(i, offset) : 0.0f);
      }
      if (ok) {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
          if (r < rows) {
            const float a = to_float(a0[r * K + k]);
#pragma unroll
            for (int f = 0; f < F; ++f) acc[f][r] = fmaf(w[f], a, acc[f][r]);
          }
        }
      }
    }
  }

  // A butterfly sum per (feature, row) of the warp, in a fixed order; lane 0 writes.
#pragma unroll
  for (int f = 0; f < F; ++f) {
#pragma unroll
    for (int r = 0; r < MR; ++r) {
      if (f < feats && r < rows) {  // uniform over the warp
        float v = acc[f][r];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (lane == 0) {
          if (bias != nullptr) v += to_float(bias[n0 + f]);
          out[(m0 + r) * N + n0 + f] = from_float<T>(v);
        }
      }
    }
  }
}

template <typename T>
__global__ void dequantize_4bit_weight(const unsigned char* __restrict__ B, const float* __restrict__ absmax,
                                       const unsigned char* __restrict__ absmax_8bit,
                                       const float* __restrict__ absmax_code, const float* __restrict__ absmax_offset,
                                       const float* __restrict__ code, T* __restrict__ out, long long n,
                                       int blocksize) {
  using namespace bnb_matmul_4bit;
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  __syncthreads();

  const long long i0 = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kDequantPerThread;
  if (i0 >= n) return;
  const Scales scales{absmax, absmax_8bit, absmax_code, __ffs(blocksize) - 1};
  const float offset = absmax_8bit != nullptr ? __ldg(absmax_offset) : 0.0f;
  if (i0 + kDequantPerThread <= n) {
    // i0 is a multiple of 8 and blocks hold >= 32 values: one scale for all eight.
    const float s = scales.at(i0, offset);
    float v[kDequantPerThread];
#pragma unroll
    for (int j = 0; j < kDequantPerThread / 2; ++j) {
      const unsigned int byte = __ldg(B + (i0 >> 1) + j);
      v[2 * j] = table[byte >> 4] * s;
      v[2 * j + 1] = table[byte & 15u] * s;
    }
    store_floats<T, kDequantPerThread>(out + i0, v);  // out is a fresh allocation: 16-byte aligned
  } else {
    for (long long f = i0; f < n; ++f) out[f] = from_float<T>(table[code_at(B, f)] * scales.at(f, offset));
  }
}
