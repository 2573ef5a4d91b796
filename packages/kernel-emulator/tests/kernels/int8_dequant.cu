// bitsandbytes::int8_vectorwise_dequant as a CUDA kernel: out[r, c] = A[r, c] * stats[r] / 127.
// The emulator's end-to-end test registers it as the op's kernel and runs the op's conformance cases.
#include <cuda_runtime.h>

__global__ void int8_vectorwise_dequant(const signed char* __restrict__ A, const float* __restrict__ stats,
                                        float* __restrict__ out, int rows, int cols) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(rows) * cols) return;
  const int row = static_cast<int>(i / cols);
  // The reference's order of float operations, (code * stat) * (1 / 127), so results match bit for bit.
  out[i] = static_cast<float>(A[i]) * stats[row] * (1.0f / 127.0f);
}
