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
// gemm_4bit_tc<T, MT>: the same product on tensor cores (WMMA, fp32 accumulation) for fp16/bf16 A of
//   up to 16 * MT rows (MT = 1, 2, 4: short prefill, small batches). See the comment above the kernel.
// dequantize_4bit_weight: W (flat, n values) rounded to T, for the many-rows path (the op multiplies it
//   with torch). 8 values per thread, one 16-byte store (fp16/bf16) or two (fp32).
#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <type_traits>

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

// ---- gemm_4bit_tc: tensor cores for 9..64 rows of fp16/bf16 A ------------------------------------------
// A block owns kTcFeatures output features and every row of A (all M <= 16 * MT rows: the weight is read
// from memory once), and walks K in chunks of kTcChunk (a slice of chunks when the grid splits K,
// gridDim.y > 1). Per chunk each thread loads 16 bytes of packed weights (32 codes of one feature,
// coalesced: two threads cover a feature's 32 bytes of the chunk) and MT 16-byte pieces of A, in registers
// only; the next chunk's loads are issued before this chunk's products, so a block keeps one chunk of
// loads in flight while its warps multiply. The weights are decoded into shared memory as T, exactly the
// reference's weight rounded to A's dtype (code[c] * scale in fp32, one rounding; nested scales decoded at
// the load as the SIMT kernel does), A is copied there as it is; warp w multiplies its 16 features by all
// MT row tiles with WMMA m16n16k16 (A row-major, W^T column-major: W's rows are B's columns), fp32
// accumulators. The epilogue goes through shared memory (a fragment's element mapping is opaque): one
// split adds the bias in fp32 and rounds once to T, as the reference; several splits write fp32 partial
// sums that gemm_4bit_tc_reduce adds in split order (deterministic), then bias and one rounding.
// Requirements (checked by the op): K % 32 == 0, A and B 16-byte aligned, M <= 16 * MT. Shared rows are
// padded to kTcLd = 72 elements (144 bytes: ldm a multiple of 8, every fragment pointer 32-byte aligned,
// rows 4 banks apart so the 16 rows of a fragment load do not hit the same banks).
// Arch: WMMA on fp16 exists from sm_70, on bf16 from sm_80; the bf16 instances built for sm_75 trap (the
// op never launches them there: ops/matmul_4bit.py matmul_route).
constexpr int kTcWarps = 4;
constexpr int kTcFeatures = 16 * kTcWarps;
constexpr int kTcChunk = 64;
constexpr int kTcLd = kTcChunk + 8;
constexpr int kTcReduceThreads = 256;
// 4 blocks per SM asked of ptxas: a cap of 128 registers (the MT = 4 instance holds 32 accumulators, its
// next chunk's 4 pieces of A and 16 bytes of B in registers); shared memory (up to 18 KB a block) lets
// more in. tests/test_registers.py holds every instance to no spills.
constexpr int kTcMinBlocks = 4;

template <typename T>
struct TcShared {
  static constexpr int kMaxRows = 64;
  union {
    struct {
      T w[kTcFeatures][kTcLd];  // the chunk's weights, feature-major: B = W^T column-major
      T a[kMaxRows][kTcLd];     // the chunk of A, row-major (rows past M are zeros)
    } in;
    float acc[kTcWarps][kMaxRows][16];  // the epilogue: each warp's accumulators, row-major
  };
};

// <mma.h> declares nothing for device code below sm_70 (a CUDA 12 source build for sm_6x, which the
// unsupported-device message suggests), so the body is compiled only where WMMA exists.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 700
#define BNB_MATMUL_4BIT_WMMA 1
#endif

template <typename T, int MT>
__device__ __forceinline__ void gemm_4bit_tc_body(const T* __restrict__ A, const unsigned char* __restrict__ B,
                                                  const float* __restrict__ absmax,
                                                  const unsigned char* __restrict__ absmax_8bit,
                                                  const float* __restrict__ absmax_code,
                                                  const float* __restrict__ absmax_offset,
                                                  const float* __restrict__ code, const T* __restrict__ bias,
                                                  T* __restrict__ out, float* __restrict__ partial, long long M,
                                                  long long N, long long K, int blocksize, int chunks_per_split) {
#ifndef BNB_MATMUL_4BIT_WMMA
  __trap();
#else
  using namespace bnb_matmul_4bit;
  using namespace nvcuda;
  constexpr int kRows = 16 * MT;
  __shared__ __align__(32) unsigned char smem_raw[sizeof(TcShared<T>)];
  __shared__ float table[16];
  TcShared<T>& sm = *reinterpret_cast<TcShared<T>*>(smem_raw);

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  if (tid < 16) table[tid] = __ldg(code + tid);
  const long long n0 = static_cast<long long>(blockIdx.x) * kTcFeatures;
  const int rows = static_cast<int>(M);
  const int chunks = static_cast<int>((K + kTcChunk - 1) / kTcChunk);
  const int c_begin = static_cast<int>(blockIdx.y) * chunks_per_split;
  const int c_end = min(c_begin + chunks_per_split, chunks);
  const Scales scales{absmax, absmax_8bit, absmax_code, __ffs(blocksize) - 1};
  const float offset = absmax_8bit != nullptr ? __ldg(absmax_offset) : 0.0f;

  // This thread's share of a chunk: 32 weights of feature fw at k offset kw, and MT pieces of 8 values of
  // A (piece j: row (tid + 128 j) / 8, columns 8 * ((tid + 128 j) % 8)).
  const int fw = tid >> 1;
  const int kw = (tid & 1) * 32;
  const long long nw = n0 + fw;
  uint4 wq;
  float ws;
  uint4 aq[MT];
  const auto fetch = [&](int c) {
    const long long k = static_cast<long long>(c) * kTcChunk + kw;
    const bool live = nw < N && k < K;
    const long long f = nw * K + k;
    wq = live ? __ldg(reinterpret_cast<const uint4*>(B + (f >> 1))) : make_uint4(0u, 0u, 0u, 0u);
    ws = live ? scales.at(f, offset) : 0.0f;
#pragma unroll
    for (int j = 0; j < MT; ++j) {
      const int i = tid + j * kTcWarps * 32;
      const int r = i >> 3;
      const long long ka = static_cast<long long>(c) * kTcChunk + (i & 7) * 8;
      aq[j] = r < rows && ka < K ? __ldg(reinterpret_cast<const uint4*>(A + r * K + ka)) : make_uint4(0u, 0u, 0u, 0u);
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) wmma::fill_fragment(acc[t], 0.0f);

  if (c_begin < c_end) fetch(c_begin);
#pragma unroll 1
  for (int c = c_begin; c < c_end; ++c) {
    __syncthreads();  // the previous chunk's fragments are loaded: its shared tiles may be overwritten
    {
      const unsigned int words[4] = {wq.x, wq.y, wq.z, wq.w};
      float w[32];
#pragma unroll
      for (int b = 0; b < 16; ++b) {  // byte b: weights 2b (high nibble) and 2b + 1
        const unsigned int byte = (words[b / 4] >> (8 * (b % 4))) & 0xFFu;
        w[2 * b] = table[byte >> 4] * ws;
        w[2 * b + 1] = table[byte & 15u] * ws;
      }
      store_floats<T, 32>(&sm.in.w[fw][kw], w);
#pragma unroll
      for (int j = 0; j < MT; ++j) {
        const int i = tid + j * kTcWarps * 32;
        *reinterpret_cast<uint4*>(&sm.in.a[i >> 3][(i & 7) * 8]) = aq[j];
      }
    }
    __syncthreads();
    if (c + 1 < c_end) fetch(c + 1);  // in flight while the warps multiply
#pragma unroll
    for (int ks = 0; ks < kTcChunk; ks += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, &sm.in.w[warp * 16][ks], kTcLd);
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, &sm.in.a[t * 16][ks], kTcLd);
        wmma::mma_sync(acc[t], fa, fb, acc[t]);
      }
    }
  }

  __syncthreads();  // every warp is done with the tiles: the union becomes the accumulators
#pragma unroll
  for (int t = 0; t < MT; ++t) wmma::store_matrix_sync(&sm.acc[warp][t * 16][0], acc[t], 16, wmma::mem_row_major);
  __syncwarp();
  const long long nf = n0 + warp * 16;
  for (int i = lane; i < kRows * 16; i += 32) {
    const int r = i >> 4;
    const long long n = nf + (i & 15);
    if (r < rows && n < N) {
      float v = sm.acc[warp][r][i & 15];
      if (partial != nullptr) {
        partial[(static_cast<long long>(blockIdx.y) * M + r) * N + n] = v;
      } else {
        if (bias != nullptr) v += to_float(bias[n]);
        out[r * N + n] = from_float<T>(v);
      }
    }
  }
#endif
}

template <typename T, int MT>
__global__ void __launch_bounds__(kTcWarps * 32, kTcMinBlocks)
    gemm_4bit_tc(const T* __restrict__ A, const unsigned char* __restrict__ B, const float* __restrict__ absmax,
                 const unsigned char* __restrict__ absmax_8bit, const float* __restrict__ absmax_code,
                 const float* __restrict__ absmax_offset, const float* __restrict__ code, const T* __restrict__ bias,
                 T* __restrict__ out, float* __restrict__ partial, long long M, long long N, long long K, int blocksize,
                 int chunks_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    __trap();  // no bf16 WMMA before sm_80
  else
#endif
    gemm_4bit_tc_body<T, MT>(A, B, absmax, absmax_8bit, absmax_code, absmax_offset, code, bias, out, partial, M, N, K,
                             blocksize, chunks_per_split);
}

// out[m, n] = sum over the splits, in split order, of partial[s, m, n] (+ bias[n]), rounded once to T.
template <typename T>
__global__ void gemm_4bit_tc_reduce(const float* __restrict__ partial, const T* __restrict__ bias, T* __restrict__ out,
                                    long long M, long long N, int splits) {
  using namespace bnb_matmul_4bit;
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long mn = M * N;
  if (i >= mn) return;
  float v = partial[i];
  for (int s = 1; s < splits; ++s) v += partial[s * mn + i];
  if (bias != nullptr) v += to_float(bias[i % N]);
  out[i] = from_float<T>(v);
}
