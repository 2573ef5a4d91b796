// Block scaling shared by the 8-bit and 4-bit quantizers (compiled into each ISA's translation units).
// Mirrors block_absmax_and_scale in bitsandbytes/_reference/blockwise.py operation for operation, so
// codes are bit-identical to the reference.
#pragma once

#include <bitsandbytes/formats.h>

#include "common.h"

namespace bnb {
namespace BNB_ISA_NS {

// Largest |x| of a block, NaN if the block holds a NaN (like torch.amax), in float32.
template <DType D>
inline float block_absmax(const typename Elem<D>::T* x, int64_t len) {
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < len; ++i) {
    float v = std::fabs(Elem<D>::load(x[i]));
    nan |= v != v;
    m = v > m ? v : m;
  }
  return nan ? NAN : m;
}

// Maps a value into [-1, 1] the way the reference does: a full block multiplies by the reciprocal of
// its clamped absmax, the short last block divides by it (upstream does both; they can differ in the
// last bit). NaN stays NaN.
struct BlockScaler {
  float clamped, inv;
  bool full;
  BlockScaler(float absmax, bool full_block)
      : clamped(absmax != absmax ? absmax : (absmax < BNB_MIN_SCALE ? BNB_MIN_SCALE : absmax)),
        inv(1.0f / clamped),
        full(full_block) {}
  float operator()(float x) const {
    float s = full ? x * inv : x / clamped;
    return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
  }
};

// Number of midpoints strictly below s (the value-sorted slot of the nearest code); NaN -> last slot.
inline int sorted_slot(const float* mids, int n_mids, float s) {
  if (s != s) return n_mids;
  int lo = 0, len = n_mids;
  while (len > 0) {
    int half = len / 2;
    bool below = mids[lo + half] < s;
    lo = below ? lo + half + 1 : lo;
    len = below ? len - half - 1 : half;
  }
  return lo;
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
