#include "array.h"
#include "bindings.h"
#include "huge_pages.h"
#include "isa.h"
#include "kernels/blockwise.h"
#include "nearest_code_build.h"

namespace bnb {

BNB_BINDINGS(blockwise) {
  m.def("quantize_blockwise", [](Array A, Array code, int64_t blocksize, Array out, Array absmax, int threads) {
    check_blocksize(blocksize);
    DType dt = float_dtype(A, "A");
    int64_t n = numel(A);
    const float* c = f32(code, "code", 256);
    uint8_t* q = u8(out, "out", n);
    float* am = f32(absmax, "absmax", n_blocks(n, blocksize));
    const void* x = A.data();
    nb::gil_scoped_release release;
    prefer_huge_pages(q, size_t(n));
    const NearestCode& map = nearest_code(c, 2);
    BNB_DISPATCH(quantize_blockwise, x, dt, n, map, blocksize, q, am, threads);
  });
  m.def("dequantize_blockwise", [](Array A, Array absmax, Array code, int64_t blocksize, Array out, int threads) {
    check_blocksize(blocksize);
    int64_t n = numel(A);
    const uint8_t* q = u8(A, "A");
    const float* am = f32(absmax, "absmax", n_blocks(n, blocksize));
    const float* c = f32(code, "code", 256);
    DType dt = float_dtype(out, "out");
    void* y = float_data(out, "out", dt, n);
    nb::gil_scoped_release release;
    prefer_huge_pages(y, size_t(n) * (dt == DType::f32 ? 4 : 2));
    BNB_DISPATCH(dequantize_blockwise, q, am, c, n, blocksize, y, dt, threads);
  });
}

}  // namespace bnb
