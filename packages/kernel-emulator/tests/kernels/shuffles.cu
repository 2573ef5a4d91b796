// Warp collectives: every lane writes what it received, so the tests see each lane's view.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// One result per lane for each shuffle flavour; `mask` selects the lanes that take part (the others
// write -1), `width` the segment size.
__global__ void shuffles(const int* __restrict__ in, int* __restrict__ out, unsigned mask, int delta, int width) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % warpSize;
  const int n = gridDim.x * blockDim.x;
  int v = in[t];
  int r_xor = -1, r_down = -1, r_up = -1, r_idx = -1;
  if (mask >> lane & 1u) {
    r_xor = __shfl_xor_sync(mask, v, delta, width);
    r_down = __shfl_down_sync(mask, v, delta, width);
    r_up = __shfl_up_sync(mask, v, delta, width);
    r_idx = __shfl_sync(mask, v, delta, width);
  }
  out[t] = r_xor;
  out[n + t] = r_down;
  out[2 * n + t] = r_up;
  out[3 * n + t] = r_idx;
}

// 64-bit and 16-bit values go through the same shuffles.
__global__ void shuffle_types(const double* __restrict__ d, const __half* __restrict__ h, double* __restrict__ d_out,
                              __half* __restrict__ h_out) {
  const int t = threadIdx.x;
  d_out[t] = __shfl_down_sync(0xffffffffu, d[t], 1);
  h_out[t] = __shfl_xor_sync(0xffffffffu, h[t], 3);
}

// Votes: ballot of the predicate, any and all.
__global__ void votes(const int* __restrict__ pred, unsigned* __restrict__ ballot, int* __restrict__ any,
                      int* __restrict__ all, unsigned mask) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % warpSize;
  if (!(mask >> lane & 1u)) return;  // lanes outside the mask leave the kernel: they are not named
  ballot[t] = __ballot_sync(mask, pred[t]);
  any[t] = __any_sync(mask, pred[t]);
  all[t] = __all_sync(mask, pred[t]);
}

// __syncwarp between a shared-memory write and a read across lanes of one warp.
__global__ void warp_rotate(const float* __restrict__ in, float* __restrict__ out) {
  __shared__ float s[32];
  const int lane = threadIdx.x;
  s[lane] = in[lane];
  __syncwarp();
  out[lane] = s[(lane + 1) % 32];
}

// Block-wide votes (__syncthreads_count/_or/_and) and a warp reduction (__reduce_add_sync); thread 0 of
// each block writes count, or, and, and its warp's sum.
__global__ void block_votes(const int* __restrict__ pred, int* __restrict__ out) {
  const int p = pred[blockIdx.x * blockDim.x + threadIdx.x];
  const int count = __syncthreads_count(p);
  const int any = __syncthreads_or(p);
  const int all = __syncthreads_and(p);
  const unsigned warp_sum = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(p));
  if (threadIdx.x == 0) {
    out[4 * blockIdx.x] = count;
    out[4 * blockIdx.x + 1] = any;
    out[4 * blockIdx.x + 2] = all;
    out[4 * blockIdx.x + 3] = static_cast<int>(warp_sum);
  }
}
