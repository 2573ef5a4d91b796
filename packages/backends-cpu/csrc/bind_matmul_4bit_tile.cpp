#include <bitsandbytes/formats.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>

#include "array.h"
#include "bindings.h"
#include "fourbit_args.h"
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
        NestedAbsmax nested{};
        const NestedAbsmax* np = checked_scales(absmax, absmax_8bit, absmax_code, absmax_offset, blocks, nested);
        const float* am = f32(absmax, "absmax");
        const float* c = f32(code, "code", 16);
        float* y = f32(out, "out");
        at_least(out, i1 - i0, "out");
        nb::gil_scoped_release release;
        BNB_DISPATCH(dequantize_4bit_tile_f32, b, am, np, c, blocksize, i0, i1, rd, y, threads);
      },
      nb::arg("B"), nb::arg("absmax"), nb::arg("code"), nb::arg("blocksize"), nb::arg("i0"), nb::arg("i1"),
      nb::arg("round_to"), nb::arg("out"), nb::arg("threads"), nb::arg("absmax_8bit").none() = nb::none(),
      nb::arg("absmax_code").none() = nb::none(), nb::arg("absmax_offset").none() = nb::none());
}

}  // namespace bnb
