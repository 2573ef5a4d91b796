// Self-test kernels of the emulated WMMA API (<mma.h>): one block per tile computes
// D = scale * (A @ B + C) through load_matrix_sync / mma_sync / store_matrix_sync, with every layout,
// and the misuses WMMA forbids. The operands are staged in 32-byte aligned shared memory (WMMA needs
// 256-bit aligned pointers; the emulator's global buffers are only 16-byte aligned, torch's CUDA
// allocations 512), as they are copied: a, b, c, d hold each tile's storage, ld included.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;

constexpr int kStage = 2048;  // elements of shared memory per operand

template <class T>
__device__ void stage(T* dst, const T* src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Elementwise scaling of the accumulator between mma and store, over num_elements whatever the mapping.
template <class T, int M, int N, int K, class LA, class LB, class TC, class TD>
__global__ void wmma_tile(const T* a, const T* b, const TC* c, TD* d, unsigned lda, unsigned ldb, unsigned ldc,
                          unsigned ldd, int a_n, int b_n, int c_n, int d_n, int c_col, int d_col, float scale) {
  __shared__ __align__(32) T sa[kStage];
  __shared__ __align__(32) T sb[kStage];
  __shared__ __align__(32) TC sc[kStage];
  __shared__ __align__(32) TD sd[kStage];
  stage(sa, a + blockIdx.x * a_n, a_n);
  stage(sb, b + blockIdx.x * b_n, b_n);
  if (c != nullptr) stage(sc, c + blockIdx.x * c_n, c_n);
  stage(sd, d + blockIdx.x * d_n, d_n);  // so a store past the tile's rows / columns shows
  __syncthreads();
  wmma::fragment<wmma::matrix_a, M, N, K, T, LA> fa;
  wmma::fragment<wmma::matrix_b, M, N, K, T, LB> fb;
  wmma::fragment<wmma::accumulator, M, N, K, TC> fc;
  wmma::fragment<wmma::accumulator, M, N, K, TD> fd;
  wmma::load_matrix_sync(fa, sa, lda);
  wmma::load_matrix_sync(fb, sb, ldb);
  if (c != nullptr) {
    wmma::load_matrix_sync(fc, sc, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
  } else {
    wmma::fill_fragment(fc, 0.0f);
  }
  wmma::mma_sync(fd, fa, fb, fc);
  for (int i = 0; i < fd.num_elements; ++i) fd.x[i] = fd.x[i] * static_cast<TD>(scale);
  wmma::store_matrix_sync(sd, fd, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < d_n; i += blockDim.x) d[blockIdx.x * d_n + i] = sd[i];
}

// The accumulator in place (D is C) over 2 k-steps, the shape of a GEMM main loop: A 16x32 row-major,
// B 32x16 column-major (column n at b + 32 n), D 16x16 row-major.
__global__ void wmma_accumulate_in_place(const __half* a, const __half* b, float* d) {
  __shared__ __align__(32) __half sa[16 * 32];
  __shared__ __align__(32) __half sb[32 * 16];
  __shared__ __align__(32) float sd[16 * 16];
  stage(sa, a, 16 * 32);
  stage(sb, b, 32 * 16);
  __syncwarp();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k = 0; k < 32; k += 16) {
    wmma::load_matrix_sync(fa, sa + k, 32);
    wmma::load_matrix_sync(fb, sb + k, 32);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(sd, acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int i = threadIdx.x; i < 256; i += 32) d[i] = sd[i];
}

// Misuses, by `mode`: 1 lanes diverge (two call sites), 2 half the warp calls, 3 lanes pass different
// pointers, 4 lanes pass different ldm, 0 a load at sa + offset with ldm (misaligned / bad ldm).
__global__ void wmma_misuse(const __half* a, float* d, int mode, int offset, unsigned ldm) {
  __shared__ __align__(32) __half sa[kStage];
  stage(sa, a, kStage);
  __syncthreads();
  const int lane = threadIdx.x % 32;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::fill_fragment(fa, __float2half(0.0f));
  if (mode == 1) {
    if (lane < 16) {
      wmma::load_matrix_sync(fa, sa, 16);
    } else {
      wmma::load_matrix_sync(fa, sa, 16);
    }
  } else if (mode == 2) {
    if (lane < 16) wmma::load_matrix_sync(fa, sa, 16);
  } else if (mode == 3) {
    wmma::load_matrix_sync(fa, sa + (lane & 1) * 16, 16);
  } else if (mode == 4) {
    wmma::load_matrix_sync(fa, sa, 16 + (lane & 1) * 8);
  } else {
    wmma::load_matrix_sync(fa, sa + offset, ldm);
  }
  d[threadIdx.x] = __half2float(fa.x[0]);
}

// Instances nvcc checks (tests/test_emu_cuda_subset.py compiles this file): the API use is real CUDA.
#define WMMA_TILE_ARGS(T, TC, TD) \
  (const T*, const T*, const TC*, TD*, unsigned, unsigned, unsigned, unsigned, int, int, int, int, int, int, float)
template __global__ void wmma_tile<__half, 16, 16, 16, wmma::row_major, wmma::col_major, float, float> WMMA_TILE_ARGS(
    __half, float, float);
template __global__ void wmma_tile<__half, 32, 8, 16, wmma::col_major, wmma::row_major, __half, __half> WMMA_TILE_ARGS(
    __half, __half, __half);
template __global__ void wmma_tile<__nv_bfloat16, 8, 32, 16, wmma::row_major, wmma::row_major, float, float>
WMMA_TILE_ARGS(__nv_bfloat16, float, float);
