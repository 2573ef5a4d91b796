// Atomics from many lanes and blocks.
#include <cuda_runtime.h>

__global__ void histogram(const int* __restrict__ values, int n, unsigned* __restrict__ bins, int nbins) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int v = values[i];
    if (v >= 0 && v < nbins) atomicAdd(&bins[v], 1u);
  }
}

// Sum, max and a CAS loop (float max through atomicCAS on the bit pattern) over all elements.
__global__ void reduce_atomics(const float* __restrict__ x, int n, float* __restrict__ sum, int* __restrict__ imax,
                               float* __restrict__ fmax_out, unsigned long long* __restrict__ count) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  atomicAdd(sum, x[i]);
  atomicMax(imax, __float2int_rz(x[i] * 1000.0f));
  atomicAdd(count, 1ull);
  unsigned* bits = reinterpret_cast<unsigned*>(fmax_out);
  unsigned old = *bits;
  while (__uint_as_float(old) < x[i]) {
    const unsigned assumed = old;
    old = atomicCAS(bits, assumed, __float_as_uint(x[i]));
    if (old == assumed) break;
  }
}

// atomicExch hands out a ticket per lane; atomicSub / atomicMin / atomicOr on shared counters.
__global__ void tickets(int* __restrict__ next, int* __restrict__ got, int* __restrict__ lowest,
                        unsigned* __restrict__ bits) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  got[t] = atomicAdd(next, 1);
  atomicMin(lowest, -t);
  atomicOr(bits, 1u << (t % 32));
}
