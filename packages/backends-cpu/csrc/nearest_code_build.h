// Builds the key table of an 8-bit map (kernels/nearest_code.h). Included only by the bindings, which are
// compiled once with the baseline flags: never by the per-ISA kernel sources, whose inline copies could
// otherwise be the ones the linker keeps.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "common.h"
#include "kernels/nearest_code.h"

namespace bnb {

// Sweeps the keys of `shift` in increasing value order, with two pointers giving each key's first slot (that
// of its smallest value) and last slot (that of its largest, values capped at 1). Fills m.entry when `fill`;
// returns the most slots past the first that a key reaches, flagged keys excluded (those are counted in *flags).
inline int sweep_keys(NearestCode& m, int shift, uint32_t floor_bits, bool fill, int* flags, int* width) {
  const uint32_t one = 0x3f800000u, low_mask = (1u << shift) - 1;
  const int keys = int((one - floor_bits) >> shift) + 1;
  int lo_ptr = 0, hi_ptr = 0, widest = 0;
  *flags = 0, *width = 0;
  auto advance = [&](int& ptr, float v) {
    while (ptr < 255 && m.mids[ptr] < v) ++ptr;
    return ptr;
  };
  auto visit = [&](int k, bool negative) {
    uint32_t small = k == 0 ? 0u : floor_bits + (uint32_t(k) << shift);
    uint32_t large = std::min(floor_bits + ((uint32_t(k) + 1) << shift) - 1, one);
    float smallest = bits_to_float(negative ? (large | 0x80000000u) : small);
    float largest = bits_to_float(negative ? (small | 0x80000000u) : large);
    int lo = advance(lo_ptr, smallest), hi = advance(hi_ptr, largest);
    // The bits above `shift` are shared by a key's values, except in the merged key 0 below the floor.
    bool shared_prefix = k != 0 || floor_bits == 0;
    bool flag = hi - lo >= 2 || (hi > lo && !shared_prefix);
    uint32_t threshold = low_mask;
    if (flag) {
      ++*flags;
      *width = std::max(*width, hi - lo);
    } else if (hi > lo) {  // the one midpoint inside: smallest <= mids[lo] < largest
      threshold = float_to_bits(m.mids[lo]) & low_mask;
      if (negative) threshold ^= low_mask;
      widest = std::max(widest, 1);
    }
    if (fill) m.entry[k + (negative ? keys : 0)] = uint32_t(lo) | (flag ? 0x100u : 0u) | (threshold << (32 - shift));
  };
  for (int k = keys - 1; k >= 0; --k) visit(k, true);  // -1 .. -0
  for (int k = 0; k < keys; ++k) visit(k, false);      // +0 .. 1
  return widest;
}

// The nearest-code search of a map: midpoints exactly as SortedMap in bind_blockwise.cpp (stable value
// sort, float32 (a + b) / 2), plus the key table (see NearestCode).
inline void build_nearest_code(const float* code, NearestCode& m) {
  int idx[256];
  std::iota(idx, idx + 256, 0);
  // NaN after every number, as torch.sort/argsort order it (the reference's order); a plain `<` is not
  // a strict weak order once a user's map holds NaN, and std::stable_sort's result is then undefined.
  std::stable_sort(idx, idx + 256,
                   [&](int a, int b) { return !std::isnan(code[a]) && (std::isnan(code[b]) || code[a] < code[b]); });
  m.identity = true;
  for (int i = 0; i < 256; ++i) {
    m.order[i] = idx[i];
    m.identity &= idx[i] == i;
  }
  for (int i = 0; i < 255; ++i) m.mids[i] = (code[idx[i]] + code[idx[i + 1]]) / 2.0f;
  m.mids[255] = INFINITY;
  // The floor: the exponent of the smallest non-zero |midpoint| (finite ones; 0 if there is none).
  uint32_t smallest = 0x7f800000u;
  for (int i = 0; i < 255; ++i) {
    uint32_t a = float_to_bits(m.mids[i]) & 0x7fffffffu;
    if (a != 0 && a < smallest) smallest = a;
  }
  uint32_t base = smallest >= 0x3f800000u ? 0x3f800000u : smallest & 0x7f800000u;
  // The largest shift (smallest table) whose keys all reach at most two slots; else the finest that fits.
  int chosen = -1;
  for (int shift = 21; shift >= 8; --shift) {
    uint32_t floor_bits = base > (1u << shift) ? base - (1u << shift) : 0u;
    int keys = int((0x3f800000u - floor_bits) >> shift) + 1;
    if (2 * keys > NearestCode::kMaxEntries) break;
    chosen = shift;
    int flags, width;
    sweep_keys(m, shift, floor_bits, false, &flags, &width);
    if (flags == 0) break;
  }
  if (chosen < 0) chosen = 21;  // unreachable: shift 21 always fits
  m.shift = chosen;
  m.floor_bits = base > (1u << chosen) ? base - (1u << chosen) : 0u;
  m.keys = int((0x3f800000u - m.floor_bits) >> chosen) + 1;
  int flags, width;
  sweep_keys(m, chosen, m.floor_bits, true, &flags, &width);
  m.flagged = flags > 0;
  m.width = width;
}

// Maps repeat across calls (the dynamic maps): keep the last one per thread and use (qmap1: 0, qmap2: 1,
// quantize_blockwise's code: 2), so the searches of one call, or of interleaved ops, never evict each other.
inline const NearestCode& nearest_code(const float* code, int which) {
  struct Entry {
    float code[256];
    NearestCode map;
    bool valid = false;
  };
  thread_local std::unique_ptr<Entry> cache[3];  // on the heap: ~70 KB each
  if (!cache[which]) cache[which] = std::make_unique<Entry>();
  Entry& e = *cache[which];
  if (e.valid && std::memcmp(e.code, code, sizeof e.code) == 0) return e.map;
  std::memcpy(e.code, code, sizeof e.code);
  build_nearest_code(code, e.map);
  e.valid = true;
  return e.map;
}

}  // namespace bnb
