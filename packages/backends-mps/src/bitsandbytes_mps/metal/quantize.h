// The quantizers' shared pieces (blockwise.metal, fourbit.metal): the block absmax on the magnitude bits,
// the scaling into [-1, 1] and the place of a thread's values. _assemble.py pastes this file in where a
// source says #include "quantize.h" (torch.mps.compile_shader takes one text and no include path).
// Its user generates the format constants it reads (BNB_MIN_SCALE_BITS) above the #include.

#define BNB_QUANT_ITEMS 8
#define BNB_DEQUANT_ITEMS 8

// |x| as uint bits: ordered like |x| for numbers, inf above them and every NaN above inf.
inline uint magnitude_bits(float x) { return as_type<uint>(x) & 0x7fffffffu; }

// The block's absmax from the max magnitude bits (any NaN becomes the quiet NaN, as torch's amax gives).
inline float magnitude_to_absmax(uint m) { return as_type<float>(m > 0x7f800000u ? 0x7fc00000u : m); }

// Max of m over each aligned group of `group` threads (a power of two, 4..512, dividing the threadgroup
// size). Every thread of the threadgroup calls it: above 32 it holds a barrier.
inline uint group_max(uint m, uint group, uint lid, uint sg, uint lane, threadgroup uint* scratch) {
  if (group >= 32) {
    m = simd_max(m);
  } else {
    for (ushort off = ushort(group / 2); off > 0; off >>= 1) m = max(m, simd_shuffle_xor(m, off));
  }
  if (group > 32) {
    if (lane == 0) scratch[sg] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    const uint first = (lid / group) * (group / 32);
    m = scratch[first];
    for (uint j = 1; j < group / 32; ++j) m = max(m, scratch[first + j]);
  }
  return m;
}

// Scaling into [-1, 1] as the reference: a full block multiplies by the reciprocal of c = max(absmax,
// MIN_SCALE), the short last block divides by c. Which values scale to NaN is read off the bits of the
// block's absmax and of the value (to_nan): a NaN absmax (a NaN in the block), or a value that is inf or
// NaN (its block's absmax is then inf or NaN: inf / inf). So the NaN code is chosen on loaded bits, never
// on the bits of a computed NaN, which fast math lets the compiler assume away. In a block whose absmax is
// inf, a finite value scales to 0 (x / inf).
// A subnormal c (absmax below 2**-126; MIN_SCALE itself is subnormal) would be 0 to a GPU that flushes
// subnormals (Apple's do): 1 / c = inf and x * inf = NaN. Every x of such a block is subnormal or zero
// too, x = mx * 2**-149 and c = mc * 2**-149 with integer mantissas below 2**23, so x / c = mx / mc, and
// x * round(1 / c) = mx * round(1 / mc) exactly (the powers of two cancel, and 1 / mc and the product are
// normal: rounding commutes with them). So such a block scales its values' mantissas, read off the bits,
// by its absmax's: the reference's bits whether or not the GPU flushes.
struct BlockScale {
  float clamped, inv;
  bool full, mantissas, nan_block, inf_block;
  BlockScale(float absmax, bool full_block) {
    const uint a = magnitude_bits(absmax);
    const uint c = max(a, BNB_MIN_SCALE_BITS);
    mantissas = c < 0x00800000u;
    nan_block = a > 0x7f800000u;
    inf_block = a == 0x7f800000u;
    clamped = mantissas ? float(c) : absmax;
    inv = precise::divide(1.0f, clamped);
    full = full_block;
  }
  bool to_nan(float x) const { return nan_block || magnitude_bits(x) >= 0x7f800000u; }
  // x scaled, for an x that does not scale to NaN.
  float operator()(float x) const {
    if (inf_block) return 0.0f;  // +-0: one code
    // +-mx as a float (exact: below 2**23), the sign set on the bits to keep -0
    if (mantissas) {
      const uint b = as_type<uint>(x);
      x = as_type<float>(as_type<uint>(float(b & 0x007fffffu)) | (b & 0x80000000u));
    }
    return full ? x * inv : precise::divide(x, clamped);
  }
};

// The quantizers' geometry: a group of blocksize / BNB_QUANT_ITEMS threads owns one quantization block,
// each thread BNB_QUANT_ITEMS consecutive values held in registers between the absmax reduction and
// the coding (one pass over A). Threadgroup size max(256, group), every threadgroup full (a uniform
// grid: ops/_quantize.py quantize_geometry); threadgroup tg owns blocks tg * per_group ... where per_group =
// threadgroup size / group. Threads past the last block load zeros and take part in the reductions.
// Block sizes are powers of two: shifts and masks, no division.
struct QuantPlace {
  long block, start, i;
  uint group;
  QuantPlace(uint tg, uint lid, uint tg_size, long blocksize) {
    const uint shift = ctz(uint(blocksize) / BNB_QUANT_ITEMS);  // log2(group)
    group = 1u << shift;
    block = long(tg) * (tg_size >> shift) + (lid >> shift);
    start = block * blocksize;
    i = start + long(lid & (group - 1u)) * BNB_QUANT_ITEMS;
  }
};

template <typename T>
inline void load_items(device const T* A, long i, long n, thread float* v) {
  for (int k = 0; k < BNB_QUANT_ITEMS; ++k) v[k] = i + k < n ? float(A[i + k]) : 0.0f;
}
