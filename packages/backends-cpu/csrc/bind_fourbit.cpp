#include <nanobind/stl/string.h>

#include <string>

#include "array.h"
#include "bindings.h"
#include "huge_pages.h"
#include "isa.h"
#include "kernels/fourbit.h"

namespace bnb {
namespace {

QuantType quant_type(const std::string& name) {
  if (name == "nf4") return QuantType::nf4;
  if (name == "fp4") return QuantType::fp4;
  throw std::invalid_argument("quant_type must be 'nf4' or 'fp4'; got '" + name + "'");
}

}  // namespace

BNB_BINDINGS(fourbit) {
  // out: the packed bytes as uint8 ((n + 1) / 2 of them); the glue views them as quant_storage.
  m.def("quantize_4bit", [](Array A, const std::string& qt, int64_t blocksize, Array out, Array absmax, int threads) {
    check_blocksize(blocksize);
    QuantType q = quant_type(qt);
    DType dt = float_dtype(A, "A");
    int64_t n = numel(A);
    uint8_t* packed = u8(out, "out", (n + 1) / 2);
    float* am = f32(absmax, "absmax", n_blocks(n, blocksize));
    const void* x = A.data();
    nb::gil_scoped_release release;
    prefer_huge_pages(packed, size_t((n + 1) / 2));
    BNB_DISPATCH(quantize_4bit, x, dt, n, q, blocksize, packed, am, threads);
  });
  // A: the packed bytes as uint8 (at least (n + 1) / 2); out: n = numel(out) values.
  m.def("dequantize_4bit", [](Array A, Array absmax, const std::string& qt, int64_t blocksize, Array out, int threads) {
    check_blocksize(blocksize);
    QuantType q = quant_type(qt);
    DType dt = float_dtype(out, "out");
    int64_t n = numel(out);
    const uint8_t* packed = u8(A, "A");
    if (numel(A) < (n + 1) / 2)
      throw std::invalid_argument("A must hold at least " + std::to_string((n + 1) / 2) + " bytes; got " +
                                  std::to_string(numel(A)));
    const float* am = f32(absmax, "absmax", n_blocks(n, blocksize));
    void* y = out.data();
    nb::gil_scoped_release release;
    prefer_huge_pages(y, size_t(n) * (dt == DType::f32 ? 4 : 2));
    BNB_DISPATCH(dequantize_4bit, packed, am, q, n, blocksize, y, dt, threads);
  });
}

}  // namespace bnb
