// Grid-sized elementwise kernels with a partial (tail) block, in 1-D and 2-D.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

__global__ void axpy(float a, const float* __restrict__ x, float* __restrict__ y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fmaf(a, x[i], y[i]);
}

// Row-major (rows, cols) matrix, 2-D grid of 2-D blocks.
__global__ void add_rowcol(const float* __restrict__ m, const float* __restrict__ r, const float* __restrict__ c,
                           float* __restrict__ out, int rows, int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row < rows && col < cols) out[row * cols + col] = m[row * cols + col] + r[row] + c[col];
}

// Vector loads: four floats at a time through float4, the tail one by one.
__global__ void scale4(const float* __restrict__ x, float* __restrict__ y, float s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int n4 = n / 4;
  if (i < n4) {
    float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
    v.x *= s;
    v.y *= s;
    v.z *= s;
    v.w *= s;
    reinterpret_cast<float4*>(y)[i] = v;
  } else if (i - n4 < n % 4) {
    const int j = 4 * n4 + (i - n4);
    y[j] = x[j] * s;
  }
}

// 16-bit float conversions, one element per lane.
__global__ void to_16bit(const float* __restrict__ x, unsigned short* __restrict__ h_rn,
                         unsigned short* __restrict__ h_rz, unsigned short* __restrict__ b_rn,
                         unsigned short* __restrict__ b_rz, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  h_rn[i] = __half_as_ushort(__float2half_rn(x[i]));
  h_rz[i] = __half_as_ushort(__float2half_rz(x[i]));
  b_rn[i] = __bfloat16_as_ushort(__float2bfloat16(x[i]));
  b_rz[i] = __bfloat16_as_ushort(__float2bfloat16_rz(x[i]));
}

__global__ void from_16bit(const __half* __restrict__ h, const __nv_bfloat16* __restrict__ b, float* __restrict__ hf,
                           float* __restrict__ bf, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  hf[i] = __half2float(h[i]);
  bf[i] = __bfloat162float(b[i]);
}

// Half arithmetic rounds like the hardware: each operation once, to nearest even.
__global__ void half_math(const __half* __restrict__ a, const __half* __restrict__ b, __half* __restrict__ sum,
                          __half* __restrict__ prod, __nv_bfloat16* __restrict__ bsum, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  sum[i] = __hadd(a[i], b[i]);
  prod[i] = a[i] * b[i];
  bsum[i] = __float2bfloat16(__half2float(a[i])) + __float2bfloat16(__half2float(b[i]));
}
