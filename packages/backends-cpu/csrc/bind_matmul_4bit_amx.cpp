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
#include "kernels/matmul_4bit_amx.h"

namespace bnb {
namespace {

std::string amx_unavailable() {
  const char* why = "";
  BNB_DISPATCH(amx_bf16_unavailable, &why);
  return why;
}

}  // namespace

BNB_BINDINGS(matmul_4bit_amx) {
  // Why gemm_4bit_amx_bf16 cannot run at the active level, or "" when it can (probed once per level).
  m.def("amx_bf16_unavailable", &amx_unavailable);
  // Bytes of the `work` buffer gemm_4bit_amx_bf16 takes for M rows of K.
  m.def("amx_workspace_bytes", [](int64_t M, int64_t K) {
    if (M < 0 || K < 0 || (M > 0 && K > INT64_MAX / 2 / (M + 15))) throw std::invalid_argument("M, K out of range");
    int64_t bytes = 0;
    BNB_DISPATCH(amx_workspace_bytes, M, K, &bytes);
    return bytes;
  });
  // The calling thread's tile configuration (64 bytes), then `load` loaded if given (tests).
  m.def(
      "amx_tile_config",
      [](std::optional<nb::bytes> load) {
        const std::string why = amx_unavailable();
        if (!why.empty()) throw std::runtime_error("amx_tile_config: " + why);
        if (load && load->size() != 64) throw std::invalid_argument("load must be 64 bytes");
        uint8_t out[64];
        const auto* l = load ? static_cast<const uint8_t*>(load->data()) : nullptr;
        BNB_DISPATCH(amx_tile_config, l, out);
        return nb::bytes(reinterpret_cast<const char*>(out), 64);
      },
      nb::arg("load").none() = nb::none());
  // out[M, N] = A[M, K] @ W.T (+ bias), bf16, on AMX tiles; W the [N, K] packed 4-bit weight. With
  // absmax_8bit (double quantization) absmax is absmax2, one per 256 blocks.
  m.def(
      "gemm_4bit_amx_bf16",
      [](Array A, Array B, int64_t M, int64_t N, int64_t K, Array absmax, Array code, int64_t blocksize,
         std::optional<Array> bias, Array out, Array work, int threads, std::optional<Array> absmax_8bit,
         std::optional<Array> absmax_code, std::optional<Array> absmax_offset) {
        const std::string why = amx_unavailable();
        if (!why.empty()) throw std::runtime_error("gemm_4bit_amx_bf16: " + why);
        check_blocksize(blocksize);
        if (blocksize < 64) throw std::invalid_argument("blocksize must be >= 64 for the AMX kernel");
        if (M < 0 || N < 0 || K < 0) throw std::invalid_argument("M, N and K must be >= 0");
        if (K % 64)
          throw std::invalid_argument("K must be a multiple of 64 for the AMX kernel; got " + std::to_string(K));
        if ((M && K > INT64_MAX / M) || (N && K > INT64_MAX / N) || (M && N > INT64_MAX / M))
          throw std::invalid_argument("M * K, N * K or M * N overflows int64");
        const auto* a = static_cast<const uint16_t*>(float_data(A, "A", DType::bf16, M * K));
        const uint8_t* b = u8(B, "B");
        at_least(B, ceil_div(N * K, 2), "B");
        const int64_t blocks = ceil_div(N * K, blocksize);
        NestedAbsmax nested{};
        const NestedAbsmax* np = checked_scales(absmax, absmax_8bit, absmax_code, absmax_offset, blocks, nested);
        const float* am = f32(absmax, "absmax");
        const float* c = f32(code, "code", 16);
        const auto* bs = bias ? static_cast<const uint16_t*>(float_data(*bias, "bias", DType::bf16, N)) : nullptr;
        auto* y = static_cast<uint16_t*>(float_data(out, "out", DType::bf16, M * N));
        int64_t need = 0;
        BNB_DISPATCH(amx_workspace_bytes, M, K, &need);
        void* w = u8(work, "work");
        at_least(work, need, "work");
        nb::gil_scoped_release release;
        BNB_DISPATCH(gemm_4bit_amx_bf16, a, M, N, K, b, am, np, c, blocksize, bs, y, w, threads);
      },
      nb::arg("A"), nb::arg("B"), nb::arg("M"), nb::arg("N"), nb::arg("K"), nb::arg("absmax"), nb::arg("code"),
      nb::arg("blocksize"), nb::arg("bias").none(), nb::arg("out"), nb::arg("work"), nb::arg("threads"),
      nb::arg("absmax_8bit").none() = nb::none(), nb::arg("absmax_code").none() = nb::none(),
      nb::arg("absmax_offset").none() = nb::none());
}

}  // namespace bnb
