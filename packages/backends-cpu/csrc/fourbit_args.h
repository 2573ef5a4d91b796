// Argument checks the 4-bit matmul bindings share (bind_matmul_4bit_tile.cpp, bind_matmul_4bit_amx.cpp):
// sizes as "at least", and the double-quantization arguments, after which absmax is absmax2.
#pragma once

#include <bitsandbytes/formats.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "array.h"
#include "kernels/matmul_4bit.h"

namespace bnb {

inline void at_least(const Array& a, int64_t n, const char* name) {
  if (numel(a) < n)
    throw std::invalid_argument(std::string(name) + " must have at least " + std::to_string(n) + " elements; got " +
                                std::to_string(numel(a)));
}

// ceil(n / d) without the overflow of n + d - 1 near INT64_MAX.
inline int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

// The scales of `blocks` blocks: absmax itself, or with absmax_8bit (double quantization) absmax2 (one per
// 256 blocks) and the nested codes, filled into `nested`. Returns the NestedAbsmax to pass on, or null.
inline const NestedAbsmax* checked_scales(Array& absmax, std::optional<Array>& absmax_8bit,
                                          std::optional<Array>& absmax_code, std::optional<Array>& absmax_offset,
                                          int64_t blocks, NestedAbsmax& nested) {
  f32(absmax, "absmax");
  if (!absmax_8bit) {
    at_least(absmax, blocks, "absmax");
    return nullptr;
  }
  if (!absmax_code || !absmax_offset) throw std::invalid_argument("absmax_8bit needs absmax_code and absmax_offset");
  nested.q = u8(*absmax_8bit, "absmax_8bit");
  at_least(*absmax_8bit, blocks, "absmax_8bit");
  nested.code = f32(*absmax_code, "absmax_code", 256);
  nested.offset = *f32(*absmax_offset, "absmax_offset", 1);
  at_least(absmax, n_blocks(blocks, BNB_DOUBLE_QUANT_BLOCKSIZE), "absmax");
  return &nested;
}

}  // namespace bnb
