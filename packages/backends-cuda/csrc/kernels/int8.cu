// LLM.int8(): row/column-wise int8 quantization with outlier columns, and the dequantizations.
// Formats and the order of float operations follow bitsandbytes/_reference/int8.py bit for bit:
// codes = rint(a * (rcp(absmax) * 127)), NaN -> 0, clamped to +-127; dequant (code * scale) * k.
#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common.cuh"

namespace int8_detail {

__device__ __forceinline__ signed char quantize(float v, float scale) {
  float q = rintf(__fmul_rn(v, scale));
  if (q != q) q = 0.0f;  // 0 * inf (absmax 0) and non-finite rows code to 0
  q = fminf(fmaxf(q, -127.0f), 127.0f);
  return static_cast<signed char>(q);
}

// rcp(absmax) * 127, as the reference evaluates 127 / absmax.
__device__ __forceinline__ float quant_scale(float absmax) { return __fmul_rn(__frcp_rn(absmax), 127.0f); }

}  // namespace int8_detail

// flags[c] = 1 for every column holding a value with |a| >= threshold (flags zeroed by the caller).
template <typename T>
__global__ void int8_outlier_cols(const T* __restrict__ A, float threshold, unsigned char* __restrict__ flags,
                                  long long rows, long long cols) {
  const long long c = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    if (fabsf(bnb::to_float(A[r * cols + c])) >= threshold) flags[c] = 1;  // every writer stores the same byte
  }
}

// One block per row: stats[r] = absmax of the row's inliers, codes[r, :] its int8 codes. With outlier
// flags (non-null), values with |a| >= threshold count as 0 and whole flagged columns code to 0.
template <typename T, int THREADS>
__global__ void __launch_bounds__(THREADS)
    int8_row_quant(const T* __restrict__ A, float threshold, const unsigned char* __restrict__ col_flags,
                   signed char* __restrict__ codes, float* __restrict__ stats, long long cols) {
  __shared__ float scratch[THREADS / 32];
  const long long row = blockIdx.x;
  const T* a = A + row * cols;
  signed char* q = codes + row * cols;
  const bool outliers = col_flags != nullptr;

  float m = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += THREADS) {
    float v = fabsf(bnb::to_float(a[c]));
    if (outliers && v >= threshold) v = 0.0f;
    m = bnb::nan_max(m, v);
  }
  const float absmax = bnb::block_nan_max<THREADS>(m, scratch);
  if (threadIdx.x == 0) stats[row] = absmax;

  const float scale = int8_detail::quant_scale(absmax);
  for (long long c = threadIdx.x; c < cols; c += THREADS) {
    float v = bnb::to_float(a[c]);
    if (outliers && (col_flags[c] || fabsf(v) >= threshold)) v = 0.0f;
    q[c] = int8_detail::quantize(v, scale);
  }
}

// Column absmax of the inliers: block (32, ROWS) covers 32 columns; lanes with the same x stride the rows.
template <typename T, int ROWS>
__global__ void __launch_bounds__(32 * ROWS)
    int8_col_absmax(const T* __restrict__ A, float threshold, int outliers, float* __restrict__ stats, long long rows,
                    long long cols) {
  __shared__ float partial[ROWS][33];
  const long long c = static_cast<long long>(blockIdx.x) * 32 + threadIdx.x;
  float m = 0.0f;
  if (c < cols) {
    for (long long r = threadIdx.y; r < rows; r += ROWS) {
      float v = fabsf(bnb::to_float(A[r * cols + c]));
      if (outliers && v >= threshold) v = 0.0f;
      m = bnb::nan_max(m, v);
    }
  }
  partial[threadIdx.y][threadIdx.x] = m;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int y = 1; y < ROWS; ++y) m = bnb::nan_max(m, partial[y][threadIdx.x]);
    stats[c] = m;
  }
}

// Element-wise kernels below: blocks of 1-D threads cover a tile of columns (grid.x) and stride the
// rows (grid.y), so no lane divides to find its row and column.

// codes[r, c] from the column scales; outlier values (|a| >= threshold) code to 0.
template <typename T>
__global__ void int8_col_quant(const T* __restrict__ A, float threshold, int outliers,
                               const float* __restrict__ col_stats, signed char* __restrict__ codes, long long rows,
                               long long cols) {
  const long long c = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float scale = int8_detail::quant_scale(col_stats[c]);
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    float v = bnb::to_float(A[r * cols + c]);
    if (outliers && fabsf(v) >= threshold) v = 0.0f;
    codes[r * cols + c] = int8_detail::quantize(v, scale);
  }
}

// out[r, c] = (A[r, c] * stats[r]) * (1/127).
__global__ void int8_vectorwise_dequant(const signed char* __restrict__ A, const float* __restrict__ stats,
                                        float* __restrict__ out, long long rows, long long cols) {
  const long long c = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    const long long i = r * cols + c;
    out[i] = __fmul_rn(__fmul_rn(static_cast<float>(A[i]), stats[r]), BNB_INT8_DEQUANT_SCALE);
  }
}

// out[r, c] = T((A[r, c] * (row[r] * col[c])) * k + bias[c]); bias is fp32 or null. Explicit _rn
// operations keep nvcc from contracting into an FMA, which would round differently from the reference.
template <typename T>
__global__ void int8_mm_dequant(const int* __restrict__ A, const float* __restrict__ row_stats,
                                const float* __restrict__ col_stats, const float* __restrict__ bias,
                                T* __restrict__ out, long long rows, long long cols) {
  const long long c = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const float col = col_stats[c];
  const float b = bias != nullptr ? bias[c] : 0.0f;
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    const long long i = r * cols + c;
    const float v =
        __fmul_rn(__fmul_rn(static_cast<float>(A[i]), __fmul_rn(row_stats[r], col)), BNB_INT8_MM_DEQUANT_SCALE);
    out[i] = bnb::from_float<T>(bias != nullptr ? __fadd_rn(v, b) : v);
  }
}
