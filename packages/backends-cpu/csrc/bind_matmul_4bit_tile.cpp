#include <bitsandbytes/formats.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "array.h"
#include "bindings.h"
#include "isa.h"
#include "kernels/matmul_4bit_tile.h"

namespace bnb {
namespace {

DType round_dtype(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  throw std::invalid_argument("round_to must be 'float32', 'float16' or 'bfloat16'; got '" + name + "'");
}

void at_least(const Array& a, int64_t n, const char* name) {
  if (numel(a) < n)
    throw std::invalid_argument(std::string(name) + " must have at least " + std::to_string(n) + " elements; got " +
                                std::to_string(numel(a)));
}

// ceil(n / d) without the overflow of n + d - 1 near INT64_MAX.
int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

}  // namespace

BNB_BINDINGS(dequant_tile) {
  // out (fp32, i1 - i0 values) = the flat weights [i0, i1) of a packed 4-bit tensor, each rounded to
  // `round_to` and widened back. With absmax_8bit (double quantization) absmax is absmax2.
  m.def(
      "dequantize_4bit_tile_f32",
      [](Array B, Array absmax, Array code, int64_t blocksize, int64_t i0, int64_t i1, const std::string& round_to,
         Array out, int threads, std::optional<Array> absmax_8bit, std::optional<Array> absmax_code,
         std::optional<Array> absmax_offset) {
        check_blocksize(blocksize);
        if (i0 < 0) throw std::invalid_argument("i0 must be >= 0");
        if (i1 < i0) throw std::invalid_argument("i1 must be >= i0");
        const DType rd = round_dtype(round_to);
        const uint8_t* b = u8(B, "B");
        at_least(B, ceil_div(i1, 2), "B");
        const int64_t blocks = ceil_div(i1, blocksize);
        const float* am = f32(absmax, "absmax");
        NestedAbsmax nested{};
        if (absmax_8bit) {
          if (!absmax_code || !absmax_offset)
            throw std::invalid_argument("absmax_8bit needs absmax_code and absmax_offset");
          nested.q = u8(*absmax_8bit, "absmax_8bit");
          at_least(*absmax_8bit, blocks, "absmax_8bit");
          nested.code = f32(*absmax_code, "absmax_code", 256);
          nested.offset = *f32(*absmax_offset, "absmax_offset", 1);
          at_least(absmax, n_blocks(blocks, BNB_DOUBLE_QUANT_BLOCKSIZE), "absmax");
        } else {
          at_least(absmax, blocks, "absmax");
        }
        const float* c = f32(code, "code", 16);
        float* y = f32(out, "out");
        at_least(out, i1 - i0, "out");
        const NestedAbsmax* np = absmax_8bit ? &nested : nullptr;
        nb::gil_scoped_release release;
        BNB_DISPATCH(dequantize_4bit_tile_f32, b, am, np, c, blocksize, i0, i1, rd, y, threads);
      },
      nb::arg("B"), nb::arg("absmax"), nb::arg("code"), nb::arg("blocksize"), nb::arg("i0"), nb::arg("i1"),
      nb::arg("round_to"), nb::arg("out"), nb::arg("threads"), nb::arg("absmax_8bit").none() = nb::none(),
      nb::arg("absmax_code").none() = nb::none(), nb::arg("absmax_offset").none() = nb::none());
}

}  // namespace bnb
