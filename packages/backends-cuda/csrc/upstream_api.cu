// Upstream bitsandbytes' C entry points (its csrc/pythonInterface.cpp, 0.50), for code that calls the
// native library through ctypes itself (unsloth, axolotl): the same names, argument order and C types.
// Each forwards to this library's generated launcher of the existing kernel, on the stream passed in;
// nothing synchronizes. Upstream's functions return void; these return the launch's cudaError_t as
// int (a caller that ignores the result, as upstream's callers do, sees no difference), and
// cudaErrorInvalidValue, launching nothing, for arguments the kernels cannot serve.
//
// Semantics are the ops' (the reference in bitsandbytes/_reference): 8-bit blockwise dequantization,
// NF4/FP4 dequantization of the standard packed layout, and the 4-bit inference gemv. Upstream's gemv
// entry reads one row of A (k values) and writes m outputs; like upstream's kernel it ignores n, lda
// and ldc, and B must be the packed [m, k] weight (ldb = (k + 1) / 2 bytes per row).
#include <cstdint>

#include "launcher.h"
#include "launchers.gen.h"

namespace {

constexpr int kInvalidValue = 1;  // cudaErrorInvalidValue

// Launch geometry, as bitsandbytes_cuda/ops computes it for the same kernels (a test compares them):
// ops/blockwise.py THREADS, ITEMS_PER_THREAD, MAX_GRID; tables/matmul_4bit.py GEMV_WARPS, GEMV_WARP_FEATURES[1]
// (the one-row instantiations are the ones used here).
constexpr long long kDequantThreads = 256;
constexpr long long kDequantItems = 8;
constexpr long long kDequantMaxGrid = 4096;
constexpr unsigned kGemvWarps = 4;
constexpr unsigned kGemvWarpFeatures = 2;

// The kernels turn the block size into a shift.
bool power_of_two(int v) { return v > 0 && (v & (v - 1)) == 0; }

bool aligned(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

unsigned dequantize_grid(long long n) {
  const long long blocks = (n + kDequantThreads * kDequantItems - 1) / (kDequantThreads * kDequantItems);
  return static_cast<unsigned>(blocks < kDequantMaxGrid ? blocks : kDequantMaxGrid);
}

template <class T, class Launcher>
int dequantize_8bit(Launcher launcher, const float* code, const unsigned char* A, const float* absmax, T* out,
                    int blocksize, int n, cudaStream_t stream) {
  if (n < 0 || !power_of_two(blocksize)) return kInvalidValue;
  if (n == 0) return 0;
  if (code == nullptr || A == nullptr || absmax == nullptr || out == nullptr) return kInvalidValue;
  return launcher(dequantize_grid(n), 1, 1, kDequantThreads, 1, 1, 0, stream, A, absmax, code, out, n, blocksize);
}

// Upstream passes (and ignores) a null code for NF4/FP4: the table is the format's.
template <class T, class Launcher>
int dequantize_4bit(Launcher launcher, const unsigned char* A, const float* absmax, T* out, int blocksize, int n,
                    cudaStream_t stream) {
  if (n < 0 || !power_of_two(blocksize)) return kInvalidValue;
  if (n == 0) return 0;
  if (A == nullptr || absmax == nullptr || out == nullptr) return kInvalidValue;
  return launcher(dequantize_grid(n), 1, 1, kDequantThreads, 1, 1, 0, stream, A, absmax, out, n, blocksize);
}

template <class T, class Launcher>
int gemv_4bit(Launcher v16, Launcher v4, Launcher any, int m, int k, const T* A, const unsigned char* B,
              const float* absmax, const float* code, T* out, int ldb, int blocksize, cudaStream_t stream) {
  if (m < 0 || k < 0 || ldb != (k + 1) / 2 || !power_of_two(blocksize)) return kInvalidValue;
  if (m == 0) return 0;
  if (A == nullptr || B == nullptr || absmax == nullptr || code == nullptr || out == nullptr) return kInvalidValue;
  // The paths as the op picks them (ops/matmul_4bit.py); a vector path's chunks (32 or 8 weights, starting
  // at multiples of their size) must not straddle a block of scales.
  Launcher path = any;
  if (k % 32 == 0 && blocksize >= 32 && aligned(A, 16) && aligned(B, 16)) {
    path = v16;
  } else if (k % 8 == 0 && blocksize >= 8 && aligned(A, 16) && aligned(B, 4)) {
    path = v4;
  }
  constexpr unsigned kPerBlock = kGemvWarps * kGemvWarpFeatures;
  const unsigned grid = (static_cast<unsigned>(m) + kPerBlock - 1) / kPerBlock;
  return path(grid, 1, 1, kGemvWarps * 32, 1, 1, 0, stream, A, B, absmax, nullptr, nullptr, nullptr, code, nullptr, out,
              1, m, k, blocksize);
}

}  // namespace

extern "C" {

// 8-bit blockwise: out[i] = code[A[i]] * absmax[i / blocksize].
BNB_EXPORT int cdequantize_blockwise_fp32(float* code, unsigned char* A, float* absmax, float* out, int blocksize,
                                          const int n, cudaStream_t stream) {
  return dequantize_8bit(bnb_cuda_dequantize_blockwise_f32, code, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_fp16(float* code, unsigned char* A, float* absmax, __half* out, int blocksize,
                                          const int n, cudaStream_t stream) {
  return dequantize_8bit(bnb_cuda_dequantize_blockwise_f16, code, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_bf16(float* code, unsigned char* A, float* absmax, __nv_bfloat16* out,
                                          int blocksize, const int n, cudaStream_t stream) {
  return dequantize_8bit(bnb_cuda_dequantize_blockwise_bf16, code, A, absmax, out, blocksize, n, stream);
}

// NF4 / FP4: A holds (n + 1) / 2 bytes, the first value of each byte in the high nibble.
BNB_EXPORT int cdequantize_blockwise_fp32_nf4(float* code, unsigned char* A, float* absmax, float* out, int blocksize,
                                              const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_nf4_f32, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_fp16_nf4(float* code, unsigned char* A, float* absmax, __half* out, int blocksize,
                                              const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_nf4_f16, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_bf16_nf4(float* code, unsigned char* A, float* absmax, __nv_bfloat16* out,
                                              int blocksize, const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_nf4_bf16, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_fp32_fp4(float* code, unsigned char* A, float* absmax, float* out, int blocksize,
                                              const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_fp4_f32, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_fp16_fp4(float* code, unsigned char* A, float* absmax, __half* out, int blocksize,
                                              const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_fp4_f16, A, absmax, out, blocksize, n, stream);
}

BNB_EXPORT int cdequantize_blockwise_bf16_fp4(float* code, unsigned char* A, float* absmax, __nv_bfloat16* out,
                                              int blocksize, const int n, cudaStream_t stream) {
  (void)code;
  return dequantize_4bit(bnb_cuda_dequantize_4bit_fp4_bf16, A, absmax, out, blocksize, n, stream);
}

// 4-bit inference: out[j] = sum_i A[i] * W[j, i] for j < m, i < k; datatype is the 16-entry code table.
BNB_EXPORT int cgemm_4bit_inference_naive_fp16(int m, int n, int k, __half* A, unsigned char* B, float* absmax,
                                               float* datatype, __half* out, int lda, int ldb, int ldc, int blocksize,
                                               cudaStream_t stream) {
  (void)n, (void)lda, (void)ldc;
  return gemv_4bit(bnb_cuda_gemv_4bit_f16_v16_m1, bnb_cuda_gemv_4bit_f16_v4_m1, bnb_cuda_gemv_4bit_f16_any_m1, m, k, A,
                   B, absmax, datatype, out, ldb, blocksize, stream);
}

BNB_EXPORT int cgemm_4bit_inference_naive_bf16(int m, int n, int k, __nv_bfloat16* A, unsigned char* B, float* absmax,
                                               float* datatype, __nv_bfloat16* out, int lda, int ldb, int ldc,
                                               int blocksize, cudaStream_t stream) {
  (void)n, (void)lda, (void)ldc;
  return gemv_4bit(bnb_cuda_gemv_4bit_bf16_v16_m1, bnb_cuda_gemv_4bit_bf16_v4_m1, bnb_cuda_gemv_4bit_bf16_any_m1, m, k,
                   A, B, absmax, datatype, out, ldb, blocksize, stream);
}

BNB_EXPORT int cgemm_4bit_inference_naive_fp32(int m, int n, int k, float* A, unsigned char* B, float* absmax,
                                               float* datatype, float* out, int lda, int ldb, int ldc, int blocksize,
                                               cudaStream_t stream) {
  (void)n, (void)lda, (void)ldc;
  return gemv_4bit(bnb_cuda_gemv_4bit_f32_v16_m1, bnb_cuda_gemv_4bit_f32_v4_m1, bnb_cuda_gemv_4bit_f32_any_m1, m, k, A,
                   B, absmax, datatype, out, ldb, blocksize, stream);
}

}  // extern "C"
