// The key table that finds the nearest code of an 8-bit map arithmetically from a float's bits (shared by
// quantize_blockwise and the 8-bit optimizers). Plain data: built once per map by nearest_code_build.h in
// the bindings, read by every ISA level (search8.h).
#pragma once

#include <cstdint>

namespace bnb {

// The nearest-code search of one 256-entry map: the value-sorted float32 midpoints (exactly as SortedMap
// in bind_blockwise.cpp computes them) and a table of "keys": a scaled value s in [-1, 1] is keyed by its
// sign and the bits of |s| above `shift` (exponent and top mantissa bits). Slots (the number of
// midpoints below s) are monotone in s, so the values of one key reach consecutive slots; `shift` is
// chosen per map so that a key reaches at most two. Magnitudes below 2^-126 * 2^(floor_bits >> 23) hold
// no non-zero midpoint and share key 0 (the floor keeps the table small). Built by the binding.
//
// An entry holds the key's first slot (bits 0-7), a flag for keys that may need more steps (bit 8) and,
// in its top `shift` bits, the low `shift` bits of the one midpoint inside the key, all ones flipped for
// negative keys: every value of a key shares its other bits, so "midpoint < s" is an integer comparison
// of those bits with s's own (flipped alike). Keys with no midpoint inside, and flagged ones, hold all
// ones there, which no s exceeds; flagged keys step on through `mids` (at most `width` steps).
struct NearestCode {
  static constexpr int kMaxEntries = 16384;
  float mids[256];              // 255 midpoints, then +inf so a step never passes the last slot
  int32_t order[256];           // code of each value-sorted slot
  uint32_t entry[kMaxEntries];  // [keys of s >= +0][keys of s <= -0]
  int shift;                    // key = (max(|s| bits, floor_bits) - floor_bits) >> shift
  uint32_t floor_bits;
  int keys;       // keys per sign
  int width;      // most steps a flagged key may need
  bool flagged;   // any key flagged
  bool identity;  // order[i] == i (sorted maps, such as the dynamic maps)
};

}  // namespace bnb
