// The blockwise family: 8-bit blockwise quantization with a 256-entry map.
// Semantics (the contract): bitsandbytes/_reference/blockwise.py. Launch geometry is computed in one
// place, bitsandbytes_cuda/ops/blockwise.py; the constraints it must meet (here and in fourbit.cu, whose
// 4-bit kernels share it) are stated here.
//
// Quantizers: a group of blocksize / kItems threads owns one quantization block, each thread kItems
// consecutive values, so the input is read once (16-byte loads) and kept in registers between the
// absmax reduction and the coding. blockDim.x = max(256, blocksize / kItems); the grid strides over
// rounds of blockDim.x / group blocks. Dequantizers: each thread writes kItems consecutive values; any
// blockDim.x >= 32 (256 expected); the grid strides.
#include "block_quant.cuh"

namespace bnb_quant {

// ---------------------------------------------------------------------------------------------------
// 8-bit: the map sorted by value.

// a < b in torch's sort order: NaN after every number, NaNs equal among themselves.
__device__ __forceinline__ bool sorts_before(float a, float b) { return a < b || (b != b && a == a); }

}  // namespace bnb_quant

// The nearest-code search needs the map sorted by value: mids[i] = (v[i] + v[i + 1]) / 2 in float32
// over the stably value-sorted map v, and order[i] = the code of v[i] (mids[255] = +inf, unused).
// One block of 256 threads; each thread finds the stable rank of one entry.
__global__ void __launch_bounds__(256)
    quant_map_prepare(const float* __restrict__ code, float* __restrict__ mids, unsigned char* __restrict__ order) {
  __shared__ float values[256], sorted[256];
  const int i = threadIdx.x;
  const float c = code[i];
  values[i] = c;
  __syncthreads();
  int rank = 0;  // every lane reads the same entry at once: a shared-memory broadcast
  for (int j = 0; j < 256; ++j) {
    const float d = values[j];
    rank += bnb_quant::sorts_before(d, c) || (j < i && !bnb_quant::sorts_before(c, d));
  }
  sorted[rank] = c;
  order[rank] = static_cast<unsigned char>(i);
  __syncthreads();
  mids[i] = i < 255 ? (sorted[i] + sorted[i + 1]) / 2.0f : __uint_as_float(0x7f800000u);
}

namespace bnb_quant {

// Slot of s in the sorted map: how many of the 255 midpoints are < s (the reference's bucketize), by a
// branchless binary search. `!(s <= m)` is `m < s` for numbers and true for NaN, so NaN takes the last
// slot: the code of the largest map value, as the reference.
__device__ __forceinline__ int slot256(const float* mids, float s) {
  int j = 0;
#pragma unroll
  for (int step = 128; step > 0; step /= 2) j += !(s <= mids[j + step - 1]) ? step : 0;
  return j;
}

}  // namespace bnb_quant

// absmax[b] and the code of every value of A[0, n), blockwise (map prepared by quant_map_prepare).
template <class T>
__global__ void quantize_blockwise(const T* __restrict__ A, const float* __restrict__ map_mids,
                                   const unsigned char* __restrict__ map_order, unsigned char* __restrict__ out,
                                   float* __restrict__ absmax, long long n, int blocksize) {
  using namespace bnb_quant;
  __shared__ float mids[256];
  __shared__ unsigned char order[256];
  __shared__ unsigned scratch[32];
  for (int t = threadIdx.x; t < 256; t += blockDim.x) mids[t] = map_mids[t], order[t] = map_order[t];
  __syncthreads();

  const int group = blocksize / kItems, per_round = blockDim.x / group;
  const long long blocks = (n + blocksize - 1) / blocksize;
  const bool vec_in = aligned(A, 16), vec_out = aligned(out, 8);
  // The trip count is the same for every thread of the block, so the barriers in group_max are reached by all.
  for (long long round = blockIdx.x; round * per_round < blocks; round += gridDim.x) {
    const long long b = round * per_round + threadIdx.x / group;
    const long long start = b * blocksize, i = start + static_cast<long long>(threadIdx.x % group) * kItems;
    float v[kItems];
    load_items(A, i, n, vec_in, v);  // past n (or past the last block): zeros, which leave the max alone
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) m = max(m, magnitude_bits(v[k]));
    const float amax = magnitude_to_absmax(group_max(m, group, scratch));
    if (b >= blocks || i >= n) continue;  // after the last barrier of this round
    if (threadIdx.x % group == 0) absmax[b] = amax;

    const BlockScale scale(amax, start + blocksize <= n);
    unsigned char q[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) q[k] = order[slot256(mids, clamp_unit(scale(v[k])))];
    if (vec_out && i + kItems <= n) {
      *reinterpret_cast<uint2*>(out + i) =
          make_uint2(q[0] | q[1] << 8 | q[2] << 16 | static_cast<unsigned>(q[3]) << 24,
                     q[4] | q[5] << 8 | q[6] << 16 | static_cast<unsigned>(q[7]) << 24);
    } else {
      for (int k = 0; k < kItems && i + k < n; ++k) out[i + k] = q[k];
    }
  }
}

// out[i] = code[A[i]] * absmax[i / blocksize] in float32, rounded once to T.
template <class T>
__global__ void dequantize_blockwise(const unsigned char* __restrict__ A, const float* __restrict__ absmax,
                                     const float* __restrict__ code, T* __restrict__ out, long long n, int blocksize) {
  using namespace bnb_quant;
  __shared__ float table[256];
  for (int t = threadIdx.x; t < 256; t += blockDim.x) table[t] = code[t];
  __syncthreads();
  const int shift = __ffs(blocksize) - 1;
  const bool vec_in = aligned(A, 8), vec_out = aligned(out, 16);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * kItems;
  for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kItems; i < n; i += stride) {
    const float s = absmax[i >> shift];
    unsigned char q[kItems];
    if (vec_in && i + kItems <= n) {
      const uint2 w = *reinterpret_cast<const uint2*>(A + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) q[k] = (w.x >> (8 * k)) & 0xffu, q[k + 4] = (w.y >> (8 * k)) & 0xffu;
    } else {
#pragma unroll
      for (int k = 0; k < kItems; ++k) q[k] = i + k < n ? A[i + k] : 0;
    }
    float v[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) v[k] = table[q[k]] * s;
    store_items(out, i, n, vec_out, v);
  }
}
