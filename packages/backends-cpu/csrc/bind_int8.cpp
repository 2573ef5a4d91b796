#include <nanobind/stl/optional.h>

#include <cstring>
#include <optional>

#include "array.h"
#include "bindings.h"
#include "isa.h"
#include "kernels/int8.h"

#if defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <intrin.h>
#endif

namespace bnb {
namespace {

// AVX512-VNNI (vpdpbusd) on top of the avx512 level; only the avx512 kernels use it.
bool cpu_has_vnni() {
#if defined(BNB_HAVE_AVX512) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;  // MSVC builds have no VNNI tile (see kernels/int8.cpp): AVX-512BW is used.
#endif
}

// [..., K] as rows x K (K taken from the last dimension, so K == 0 still has a row count).
struct Rows {
  int64_t rows = 1, K = 0;
};
Rows as_rows(const Array& a, const char* name) {
  if (a.ndim() < 1) throw std::invalid_argument(std::string(name) + " must have at least one dimension");
  Rows r;
  for (size_t i = 0; i + 1 < a.ndim(); ++i) r.rows *= int64_t(a.shape(i));
  r.K = int64_t(a.shape(a.ndim() - 1));
  return r;
}

const int32_t* i32c(Array& a, const char* name, int64_t n) { return i32(a, name, n); }

// An optional float array of n elements of any float dtype (bias).
const void* opt_float(std::optional<Array>& a, const char* name, int64_t n, DType& dt) {
  if (!a) return nullptr;
  dt = float_dtype(*a, name);
  return float_data(*a, name, dt, n);
}

// Writes the indices of the flagged columns to cols (capacity K) and returns how many.
int64_t flagged_columns(const uint8_t* flags, int64_t K, int64_t* cols) {
  int64_t n = 0;
  for (int64_t k = 0; k < K; ++k)
    if (flags[k]) cols[n++] = k;
  return n;
}

}  // namespace

BNB_BINDINGS(int8) {
  m.def("int8_has_vnni", &cpu_has_vnni, "Whether the avx512 int8 GEMM can use AVX512-VNNI on this CPU.");
  m.def(
      "int8_vectorwise_quant",
      [](Array A, double threshold, Array codes, Array stats, std::optional<Array> cols, int threads) -> int64_t {
        DType dt = float_dtype(A, "A");
        Rows s = as_rows(A, "A");
        int8_t* q = i8(codes, "codes", s.rows * s.K);
        float* st = f32(stats, "stats", s.rows);
        // A column buffer (capacity K) turns outlier handling on; its count is returned.
        int64_t* c = cols ? data<int64_t>(*cols, "cols", nb::dlpack::dtype_code::Int, s.K) : nullptr;
        const void* x = A.data();
        nb::gil_scoped_release release;
        std::vector<uint8_t> flags(c ? size_t(s.K) : 0, 0);
        BNB_DISPATCH(int8_vectorwise_quant, x, dt, s.rows, s.K, float(threshold), q, st, c ? flags.data() : nullptr,
                     threads);
        return c ? flagged_columns(flags.data(), s.K, c) : 0;
      },
      nb::arg("A"), nb::arg("threshold"), nb::arg("codes"), nb::arg("stats"), nb::arg("cols").none(),
      nb::arg("threads"));
  m.def("int8_colwise_quant", [](Array A, bool outliers, double threshold, Array codes, Array stats, int threads) {
    DType dt = float_dtype(A, "A");
    Rows s = as_rows(A, "A");
    int8_t* q = i8(codes, "codes", s.rows * s.K);
    float* st = f32(stats, "stats", s.K);
    const void* x = A.data();
    nb::gil_scoped_release release;
    BNB_DISPATCH(int8_colwise_quant, x, dt, s.rows, s.K, outliers, float(threshold), q, st, threads);
  });
  m.def("int8_vectorwise_dequant", [](Array A, Array stats, Array out, int threads) {
    Rows s = as_rows(A, "A");
    const int8_t* q = i8(A, "A", s.rows * s.K);
    const float* st = f32(stats, "stats", s.rows);
    float* y = f32(out, "out", s.rows * s.K);
    nb::gil_scoped_release release;
    BNB_DISPATCH(int8_vectorwise_dequant, q, st, s.rows, s.K, y, threads);
  });
  m.def(
      "int8_mm_dequant",
      [](Array A, Array row_stats, Array col_stats, std::optional<Array> bias, Array out, int threads) {
        Rows s = as_rows(A, "A");
        const int32_t* a = i32c(A, "A", s.rows * s.K);
        const float* rs = f32(row_stats, "row_stats", s.rows);
        const float* cs = f32(col_stats, "col_stats", s.K);
        DType bdt = DType::f32;
        const void* b = opt_float(bias, "bias", s.K, bdt);
        DType odt = float_dtype(out, "out");
        void* y = float_data(out, "out", odt, s.rows * s.K);
        nb::gil_scoped_release release;
        BNB_DISPATCH(int8_mm_dequant, a, rs, cs, b, bdt, s.rows, s.K, y, odt, threads);
      },
      nb::arg("A"), nb::arg("row_stats"), nb::arg("col_stats"), nb::arg("bias").none(), nb::arg("out"),
      nb::arg("threads"));
  m.def(
      "int8_linear_matmul",
      [](Array A, Array B, Array out, int threads, bool vnni) {
        Rows s = as_rows(A, "A");
        if (B.ndim() != 2 || int64_t(B.shape(1)) != s.K) throw std::invalid_argument("B must be [N, K]");
        int64_t N = int64_t(B.shape(0));
        const int8_t* a = i8(A, "A", s.rows * s.K);
        const int8_t* b = i8(B, "B", N * s.K);
        int32_t* y = i32(out, "out", s.rows * N);
        bool use_vnni = vnni && cpu_has_vnni();
        nb::gil_scoped_release release;
        BNB_DISPATCH(int8_linear_matmul, a, b, s.rows, N, s.K, y, use_vnni, threads);
      },
      nb::arg("A"), nb::arg("B"), nb::arg("out"), nb::arg("threads"), nb::arg("vnni") = true);
  m.def(
      "int8_scaled_mm",
      [](Array A, Array B, Array row_stats, Array col_stats, std::optional<Array> bias, Array out, int threads,
         bool vnni) {
        Rows s = as_rows(A, "A");
        if (B.ndim() != 2 || int64_t(B.shape(1)) != s.K) throw std::invalid_argument("B must be [N, K]");
        int64_t N = int64_t(B.shape(0));
        const int8_t* a = i8(A, "A", s.rows * s.K);
        const int8_t* b = i8(B, "B", N * s.K);
        const float* rs = f32(row_stats, "row_stats", s.rows);
        const float* cs = f32(col_stats, "col_stats", N);
        DType bdt = DType::f32;
        const void* bi = opt_float(bias, "bias", N, bdt);
        DType odt = float_dtype(out, "out");
        void* y = float_data(out, "out", odt, s.rows * N);
        bool use_vnni = vnni && cpu_has_vnni();
        nb::gil_scoped_release release;
        BNB_DISPATCH(int8_scaled_mm, a, b, s.rows, N, s.K, rs, cs, bi, bdt, y, odt, use_vnni, threads);
      },
      nb::arg("A"), nb::arg("B"), nb::arg("row_stats"), nb::arg("col_stats"), nb::arg("bias").none(), nb::arg("out"),
      nb::arg("threads"), nb::arg("vnni") = true);
}

}  // namespace bnb
