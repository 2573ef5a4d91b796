// Kernels with the bugs the emulator must catch (or reproduce as hardware would).
#include <cuda_runtime.h>

// The block reduction of reduce.cu without the barrier after the shared-memory store: a lane reads
// partial[t + s] before that lane has written it.
__global__ void sum_missing_barrier(const float* __restrict__ x, float* __restrict__ out) {
  __shared__ float partial[64];
  const int t = threadIdx.x;
  partial[t] = x[blockIdx.x * 64 + t];
  for (int s = 32; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
  }
  __syncthreads();
  if (t == 0) out[blockIdx.x] = partial[0];
}

// A barrier inside a branch that only some lanes take: on hardware a hang.
__global__ void divergent_barrier(float* __restrict__ out) {
  const int t = threadIdx.x;
  if (t < 16) {
    __syncthreads();
  }
  out[t] = t;
}

// Lanes past the end return before a barrier the others wait at.
__global__ void early_exit_barrier(const float* __restrict__ x, float* __restrict__ out, int n) {
  __shared__ float s[128];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  s[threadIdx.x] = x[i];
  __syncthreads();
  out[i] = s[(threadIdx.x + 1) % blockDim.x];
}

// A missing tail guard: the last block reads and writes past the end of the buffers.
__global__ void copy_unguarded(const float* __restrict__ src, float* __restrict__ dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  dst[i] = src[i];
}

__global__ void write_past_end(float* __restrict__ dst, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) dst[i] = 1.0f;  // off by one
}

__global__ void write_before_start(float* __restrict__ dst, int offset) {
  if (threadIdx.x == 0) dst[offset] = 1.0f;
}

// A shuffle from a lane outside the mask.
__global__ void shuffle_outside_mask(const int* __restrict__ in, int* __restrict__ out) {
  const int lane = threadIdx.x;
  if (lane < 16) out[lane] = __shfl_down_sync(0x0000ffffu, in[lane], 8, 32);
}

// A full-mask shuffle after half the warp has returned.
__global__ void shuffle_after_exit(const int* __restrict__ in, int* __restrict__ out) {
  const int lane = threadIdx.x;
  if (lane >= 16) return;
  out[lane] = __shfl_xor_sync(0xffffffffu, in[lane], 1);
}

// Dynamic shared memory indexed past its size.
__global__ void shared_overflow(float* __restrict__ out, int count) {
  extern __shared__ float scratch[];
  for (int i = threadIdx.x; i < count; i += blockDim.x) scratch[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) out[0] = scratch[count - 1];
}

// Block 0 waits for a flag that block 1 sets: fine on a GPU that runs both at once, but blocks run one
// after another in emulation, so block 0 spins forever (reported after BNB_EMU_TIMEOUT seconds).
__global__ void wait_for_next_block(volatile int* flag) {
  if (blockIdx.x == 0) {
    while (flag[0] == 0) {
    }
  } else if (threadIdx.x == 0) {
    flag[0] = 1;
  }
}
