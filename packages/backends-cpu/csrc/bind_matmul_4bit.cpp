#include <bitsandbytes/formats.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>

#include "array.h"
#include "bindings.h"
#include "isa.h"
#include "kernels/matmul_4bit.h"

namespace bnb {
namespace {

// Packed codes arrive as uint8 bytes (the glue views any quant_storage as bytes); at least `need`.
const uint8_t* packed_bytes(Array& B, int64_t need) {
  const uint8_t* p = u8(B, "B");
  if (numel(B) < need)
    throw std::invalid_argument("B holds " + std::to_string(numel(B)) + " bytes, fewer than the " +
                                std::to_string(need) + " needed");
  return p;
}

void check_dims(int64_t a, const char* what) {
  if (a < 0) throw std::invalid_argument(std::string(what) + " must be >= 0");
}

// The sizes arrive as plain integers, not from arrays: a product that overflows int64 would wrap to a
// small count that passes the size checks (found by ci/fuzz/fuzz_native_matmul_4bit.py).
int64_t product(int64_t a, int64_t b, const char* what) {
  if (a != 0 && b > INT64_MAX / a) throw std::invalid_argument(std::string(what) + " overflows int64");
  return a * b;
}

// ceil(n / d) and the packed bytes of n codes, without the overflow of n + d - 1 near INT64_MAX.
int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

}  // namespace

BNB_BINDINGS(matmul_4bit) {
  // out[M, N] = A[M, K] @ W.T (+ bias), W the [N, K] packed 4-bit weight with table `code`.
  // With absmax_8bit (double quantization) absmax is absmax2, one per 256 blocks, and the block scales
  // are expanded inside the kernel (absmax_code: 256 fp32, absmax_offset: one fp32).
  m.def(
      "gemv_4bit",
      [](Array A, Array B, int64_t M, int64_t N, int64_t K, Array absmax, Array code, int64_t blocksize,
         std::optional<Array> bias, Array out, int threads, std::optional<Array> absmax_8bit,
         std::optional<Array> absmax_code, std::optional<Array> absmax_offset) {
        check_blocksize(blocksize);
        check_dims(M, "M");
        check_dims(N, "N");
        check_dims(K, "K");
        const int64_t MK = product(M, K, "M * K"), NK = product(N, K, "N * K"), MN = product(M, N, "M * N");
        DType dt = float_dtype(A, "A");
        const void* a = float_data(A, "A", dt, MK);
        const uint8_t* b = packed_bytes(B, ceil_div(NK, 2));
        const int64_t blocks = ceil_div(NK, blocksize);
        NestedAbsmax nested{};
        const float* am;
        if (absmax_8bit) {
          if (!absmax_code || !absmax_offset)
            throw std::invalid_argument("absmax_8bit needs absmax_code and absmax_offset");
          nested.q = u8(*absmax_8bit, "absmax_8bit");
          if (numel(*absmax_8bit) < blocks)
            throw std::invalid_argument("absmax_8bit must have at least " + std::to_string(blocks) + " elements; got " +
                                        std::to_string(numel(*absmax_8bit)));
          nested.code = f32(*absmax_code, "absmax_code", 256);
          nested.offset = *f32(*absmax_offset, "absmax_offset", 1);
          am = f32(absmax, "absmax", n_blocks(blocks, BNB_DOUBLE_QUANT_BLOCKSIZE));
        } else {
          am = f32(absmax, "absmax", blocks);
        }
        const float* c = f32(code, "code", 16);
        const void* bs = bias ? float_data(*bias, "bias", dt, N) : nullptr;
        void* y = float_data(out, "out", dt, MN);
        const NestedAbsmax* np = absmax_8bit ? &nested : nullptr;
        nb::gil_scoped_release release;
        BNB_DISPATCH(gemv_4bit, a, dt, M, N, K, b, am, np, c, blocksize, bs, y, threads);
      },
      nb::arg("A"), nb::arg("B"), nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("absmax"), nb::arg("code"),
      nb::arg("blocksize"), nb::arg("bias").none(), nb::arg("out"), nb::arg("threads"),
      nb::arg("absmax_8bit").none() = nb::none(), nb::arg("absmax_code").none() = nb::none(),
      nb::arg("absmax_offset").none() = nb::none());
  // Whether bf16 A takes the AVX512-BF16 dot-product path at the active level; 0/1 switch it (tests).
  m.def(
      "gemv_4bit_bf16_dot",
      [](int mode) {
        bool used = false;
        BNB_DISPATCH(gemv_4bit_bf16_dot, mode, &used);
        return used;
      },
      nb::arg("mode") = -1);
  // out = the flat weights [i0, i1) of a packed 4-bit tensor, rounded to out's dtype.
  m.def("dequantize_4bit_range",
        [](Array B, Array absmax, Array code, int64_t blocksize, int64_t i0, int64_t i1, Array out, int threads) {
          check_blocksize(blocksize);
          check_dims(i0, "i0");
          if (i1 < i0) throw std::invalid_argument("i1 must be >= i0");
          const uint8_t* b = packed_bytes(B, ceil_div(i1, 2));
          const float* am = f32(absmax, "absmax");
          if (numel(absmax) < ceil_div(i1, blocksize))
            throw std::invalid_argument("absmax must have at least " + std::to_string(ceil_div(i1, blocksize)) +
                                        " elements; got " + std::to_string(numel(absmax)));
          const float* c = f32(code, "code", 16);
          DType dt = float_dtype(out, "out");
          void* y = float_data(out, "out", dt, i1 - i0);
          nb::gil_scoped_release release;
          BNB_DISPATCH(dequantize_4bit_range, b, am, c, blocksize, i0, i1, y, dt, threads);
        });
  // Double-quantized block scales to fp32: code8[q[j]] * absmax2[j / 256] + offset.
  m.def("expand_nested_absmax", [](Array q, Array absmax2, Array code8, Array offset, Array out, int threads) {
    const int64_t n = numel(q);
    const uint8_t* qp = u8(q, "absmax_8bit");
    const float* a2 = f32(absmax2, "absmax", n_blocks(n, BNB_DOUBLE_QUANT_BLOCKSIZE));
    const float* c8 = f32(code8, "absmax_code", 256);
    const float off = *f32(offset, "absmax_offset", 1);
    float* y = f32(out, "out", n);
    nb::gil_scoped_release release;
    BNB_DISPATCH(expand_nested_absmax, qp, a2, c8, off, n, y, threads);
  });
}

}  // namespace bnb
