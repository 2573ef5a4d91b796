// The fourbit family: 4-bit NF4/FP4 blockwise quantization with the tables of formats.h.
// Semantics (the contract): bitsandbytes/_reference/fourbit.py. The kernels reuse the 8-bit family's block
// machinery (block_quant.cuh) and its launch geometry: the constraints stated at the top of blockwise.cu,
// computed in bitsandbytes_cuda/ops/blockwise.py.
#include "block_quant.cuh"

namespace bnb_quant {

enum QuantType4 { kNF4 = 0, kFP4 = 1 };

template <int QT>
__device__ __forceinline__ float mid4(int i) {
  return QT == kFP4 ? BNB_FP4_MIDPOINTS[i] : BNB_NF4_MIDPOINTS[i];
}
template <int QT>
__device__ __forceinline__ float value4(int i) {
  return QT == kFP4 ? BNB_FP4_TABLE[i] : BNB_NF4_TABLE[i];
}
template <int QT>
__device__ __forceinline__ unsigned order4(int i) {
  return QT == kFP4 ? BNB_FP4_ORDER[i] : BNB_NF4_ORDER[i];
}
template <int QT>
__host__ __device__ constexpr unsigned pad_code4() {
  return QT == kFP4 ? BNB_FP4_PAD_CODE : BNB_NF4_PAD_CODE;
}

// The code of every sorted slot, 4 bits each, in one register.
template <int QT>
__device__ __forceinline__ unsigned long long packed_order4() {
  unsigned long long packed = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) packed |= static_cast<unsigned long long>(order4<QT>(i)) << (4 * i);
  return packed;
}

// The code of scaled value s: how many of the 15 midpoints are < s (NaN: all of them), then the slot's
// code. Fifteen compares against constants instead of a search: no memory, no divergence. No clamp to
// [-1, 1]: every midpoint lies strictly inside, so clamping never changes the count.
template <int QT>
__device__ __forceinline__ unsigned code4(float s, unsigned long long order) {
  int slot = 0;
#pragma unroll
  for (int i = 0; i < 15; ++i) slot += !(s <= mid4<QT>(i));
  return static_cast<unsigned>(order >> (4 * slot)) & 0xfu;
}

}  // namespace bnb_quant

// absmax[b] and the packed codes of A[0, n): two per byte, the first in the high nibble; for odd n the
// last low nibble is the code of the padding value 0.0.
template <class T, int QT>
__global__ void quantize_4bit(const T* __restrict__ A, unsigned char* __restrict__ out, float* __restrict__ absmax,
                              long long n, int blocksize) {
  using namespace bnb_quant;
  static_assert(BNB_FIRST_VALUE_IN_HIGH_NIBBLE == 1, "packing below puts the first value in the high nibble");
  __shared__ unsigned scratch[32];
  const unsigned long long order = packed_order4<QT>();
  const int group = blocksize / kItems, per_round = blockDim.x / group;
  const long long blocks = (n + blocksize - 1) / blocksize;
  const bool vec_in = aligned(A, 16), vec_out = aligned(out, 4);
  for (long long round = blockIdx.x; round * per_round < blocks; round += gridDim.x) {
    const long long b = round * per_round + threadIdx.x / group;
    const long long start = b * blocksize, i = start + static_cast<long long>(threadIdx.x % group) * kItems;
    float v[kItems];
    load_items(A, i, n, vec_in, v);
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < kItems; ++k) m = max(m, magnitude_bits(v[k]));
    const float amax = magnitude_to_absmax(group_max(m, group, scratch));
    if (b >= blocks || i >= n) continue;
    if (threadIdx.x % group == 0) absmax[b] = amax;

    const BlockScale scale(amax, start + blocksize <= n);
    unsigned bytes[kItems / 2];
#pragma unroll
    for (int p = 0; p < kItems / 2; ++p) {
      const unsigned hi = code4<QT>(scale(v[2 * p]), order);
      // The padding value is 0.0 after scaling: its code is fixed, even in a NaN block.
      const unsigned lo = i + 2 * p + 1 < n ? code4<QT>(scale(v[2 * p + 1]), order) : pad_code4<QT>();
      bytes[p] = hi << 4 | lo;
    }
    const long long o = i / 2;
    if (vec_out && i + kItems <= n) {
      *reinterpret_cast<unsigned*>(out + o) = bytes[0] | bytes[1] << 8 | bytes[2] << 16 | bytes[3] << 24;
    } else {
      for (int p = 0; p < kItems / 2 && i + 2 * p < n; ++p) out[o + p] = static_cast<unsigned char>(bytes[p]);
    }
  }
}

// out[i] = table[code i] * absmax[i / blocksize] in float32, rounded once to T; A holds (n + 1) / 2 bytes.
template <class T, int QT>
__global__ void dequantize_4bit(const unsigned char* __restrict__ A, const float* __restrict__ absmax,
                                T* __restrict__ out, long long n, int blocksize) {
  using namespace bnb_quant;
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = value4<QT>(threadIdx.x);
  __syncthreads();
  const int shift = __ffs(blocksize) - 1;
  const bool vec_in = aligned(A, 4), vec_out = aligned(out, 16);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * kItems;
  for (long long i = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * kItems; i < n; i += stride) {
    const float s = absmax[i >> shift];
    const long long o = i / 2;
    unsigned w = 0;
    if (vec_in && i + kItems <= n) {
      w = *reinterpret_cast<const unsigned*>(A + o);
    } else {
      for (int p = 0; p < kItems / 2 && i + 2 * p < n; ++p) w |= static_cast<unsigned>(A[o + p]) << (8 * p);
    }
    float v[kItems];
#pragma unroll
    for (int p = 0; p < kItems / 2; ++p) {
      const unsigned byte = (w >> (8 * p)) & 0xffu;
      v[2 * p] = table[byte >> 4] * s;
      v[2 * p + 1] = table[byte & 0xfu] * s;
    }
    store_items(out, i, n, vec_out, v);
  }
}
