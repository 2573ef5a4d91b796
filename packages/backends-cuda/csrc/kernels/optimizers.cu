// Optimizer steps: optimizer_update_32bit and optimizer_update_8bit_blockwise (semantics:
// bitsandbytes/_reference/optimizers.py; element math in optimizers.cuh).
//
// Every kernel runs blocks of kBlock (256) threads over a grid of at most a few blocks per SM, each block
// striding over the data, so all loads and stores of a warp are consecutive (coalesced) and per-block
// set-up (the 8-bit maps) is paid once per block, not once per 256 elements. The rule (optimizer) is a
// uniform runtime argument: a branch every thread takes the same way costs next to nothing in these
// memory-bound kernels and keeps the kernel count (and build time) at one per dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "optimizers.cuh"

using namespace bnb_optim;

#define BNB_OPTIM_HYPER_PARAMS                                                                                    \
  float beta1, float omb1, float beta2, float omb2, float beta3, float omb3, float alpha, float eps, float gnorm, \
      float lr, float weight_decay, float decay_factor, float step_size, float adam_eps, float correction1,       \
      float correction2

#define BNB_OPTIM_HYPER                                                                                               \
  Hyper h {                                                                                                           \
    rule, flags, beta1, omb1, beta2, omb2, beta3, omb3, alpha, eps, gnorm, lr, weight_decay, decay_factor, step_size, \
        adam_eps, correction1, correction2                                                                            \
  }

// ---------------------------------------------------------------------------------------------------
// 32-bit state

// Pass 1 of max_unorm: one partial sum of the squared update norm per block, partials[blockIdx.x]
// (ademamix: the m2 sum in partials[gridDim.x + blockIdx.x]). Reads only. Fixed order, so a given grid
// always gives the same bits.
template <class T>
__global__ void __launch_bounds__(kBlock)
    optimizer_32bit_norm(const T* __restrict__ g, const float* __restrict__ state1, const float* __restrict__ state2,
                         float* __restrict__ partials, int rule, int flags, long long n, BNB_OPTIM_HYPER_PARAMS,
                         float norm_c1, float norm_c2) {
  BNB_OPTIM_HYPER;
  __shared__ float red[2][kWarps];
  const bool first = flags & kFirstStep;
  float acc = 0.0f, acc2 = 0.0f;
  for (long long i = blockIdx.x * (long long)kBlock + threadIdx.x; i < n; i += (long long)gridDim.x * kBlock) {
    float s[3] = {state1[i], 0.0f, 0.0f};
    if (rule == kAdam) s[1] = state2[i];
    if (rule == kAdemamix) s[1] = state1[n + i];
    float second = 0.0f;
    acc = add(acc, norm_term(rule, first, h, norm_c1, norm_c2, Elem<T>::load(g[i]), s, &second));
    acc2 = add(acc2, second);
  }
  for (int off = 16; off > 0; off /= 2) {
    acc = add(acc, __shfl_down_sync(0xffffffffu, acc, off));
    acc2 = add(acc2, __shfl_down_sync(0xffffffffu, acc2, off));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) red[0][warp] = acc, red[1][warp] = acc2;
  __syncthreads();
  if (threadIdx.x == 0) {
    float a = 0.0f, b = 0.0f;
    for (int w = 0; w < kWarps; ++w) a = add(a, red[0][w]), b = add(b, red[1][w]);
    partials[blockIdx.x] = a;
    partials[gridDim.x + blockIdx.x] = b;
  }
}

// Pass 2 of max_unorm, one block: unorm[0] = sum of the `count` partials (in double, fixed order); for
// ademamix (`two`) plus the sum of the second row, each rounded to float32 first as the reference adds them.
__global__ void __launch_bounds__(kBlock)
    optimizer_32bit_norm_total(const float* __restrict__ partials, int count, int two, float* __restrict__ unorm) {
  __shared__ double red[2][kWarps];
  double a = 0.0, b = 0.0;
  for (int i = threadIdx.x; i < count; i += kBlock) a += partials[i], b += partials[count + i];
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, off);
    b += __shfl_down_sync(0xffffffffu, b, off);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) red[0][warp] = a, red[1][warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    double x = 0.0, y = 0.0;
    for (int w = 0; w < kWarps; ++w) x += red[0][w], y += red[1][w];
    unorm[0] = two ? add(float(x), float(y)) : float(x);
  }
}

// The step. With kScaleByUnorm in `flags` the update is scaled by max_unorm's trust ratio: `unorm` holds
// the squared norm the scale comes from (this step's, or for lion the previous step's) and `limit` is
// max_unorm * param_norm (+ eps for one-state optimizers).
template <class T>
__global__ void __launch_bounds__(kBlock)
    optimizer_32bit(const T* __restrict__ g, T* __restrict__ p, float* __restrict__ state1, float* __restrict__ state2,
                    const float* __restrict__ unorm, int rule, int flags, long long n, BNB_OPTIM_HYPER_PARAMS,
                    float limit) {
  BNB_OPTIM_HYPER;
  float scale = 1.0f;
  if (flags & kScaleByUnorm) {
    float current = root(unorm[0]);
    // limit / current as torch computes a scalar over a tensor: reciprocal, then a product.
    if (current > limit) scale = mul(div(1.0f, current), limit);
  }
  float* second = rule == kAdemamix ? state1 + n : state2;
  const bool two = rule == kAdam || rule == kAdemamix, three = rule == kAdemamix;
  const long long first = blockIdx.x * (long long)kBlock + threadIdx.x, stride = (long long)gridDim.x * kBlock;
  long long done = 0;
  if (flags & kVector) {  // 4 elements per thread and step: a quarter of the load/store instructions
    const long long quads = n / 4;
    for (long long q = first; q < quads; q += stride) {
      const long long i = 4 * q;
      float gv[4], pv[4], a[4], b[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      load4(g + i, gv);
      load4(p + i, pv);
      load4(state1 + i, a);
      if (two) load4(second + i, b);
      if (three) load4(state2 + i, c);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        float s[3] = {a[k], b[k], c[k]};
        pv[k] = step_element(h, scale, gv[k], pv[k], s);
        a[k] = s[0], b[k] = s[1], c[k] = s[2];
      }
      store4(p + i, pv);
      store4(state1 + i, a);
      if (two) store4(second + i, b);
      if (three) store4(state2 + i, c);
    }
    done = 4 * quads;
  }
  for (long long i = done + first; i < n; i += stride) {  // everything, or the tail after the quads
    float s[3] = {state1[i], two ? second[i] : 0.0f, three ? state2[i] : 0.0f};
    p[i] = Elem<T>::store(step_element(h, scale, Elem<T>::load(g[i]), Elem<T>::load(p[i]), s));
    state1[i] = s[0];
    if (two) second[i] = s[1];
    if (three) state2[i] = s[2];
  }
}

// ---------------------------------------------------------------------------------------------------
// 8-bit blockwise state: one pass per block of kBlock states, thread t owning element t of the block:
// dequantize (qmap[code] * absmax), step in float32, write p, then each new state's absmax (a block
// max) and its nearest codes. ademamix keeps [m1 | m2] in state1 / absmax1 and nu in state2 / absmax2.
template <class T>
__global__ void __launch_bounds__(kBlock)
    optimizer_8bit_blockwise(const T* __restrict__ g, T* __restrict__ p, unsigned char* __restrict__ state1,
                             unsigned char* __restrict__ state2, float* __restrict__ absmax1,
                             float* __restrict__ absmax2, const float* __restrict__ qmap1,
                             const float* __restrict__ qmap2, int rule, int flags, long long n,
                             BNB_OPTIM_HYPER_PARAMS) {
  BNB_OPTIM_HYPER;
  __shared__ SharedMap maps[2];
  __shared__ float sorted[256];
  __shared__ unsigned scratch[3 * kWarps];
  const int states = n_states(rule);
  build_map(qmap1, maps[0], sorted);
  if (states > 1) build_map(qmap2, maps[1], sorted);

  const long long blocks = (n + kBlock - 1) / kBlock;
  // (codes, absmax, map) of each state in step_element's order.
  unsigned char* codes[3] = {state1, rule == kAdemamix ? state1 + n : state2, state2};
  float* absmax[3] = {absmax1, rule == kAdemamix ? absmax1 + blocks : absmax2, absmax2};
  const SharedMap* map[3] = {&maps[0], rule == kAdemamix ? &maps[0] : &maps[1], &maps[1]};

  for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
    const long long i = b * kBlock + threadIdx.x;
    const bool in = i < n;
    const bool full = (b + 1) * kBlock <= n;
    float s[3] = {0.0f, 0.0f, 0.0f};
    unsigned mag[3] = {0u, 0u, 0u};
    if (in) {
      for (int k = 0; k < states; ++k) s[k] = mul(map[k]->values[codes[k][i]], absmax[k][b]);
      p[i] = Elem<T>::store(step_element(h, 1.0f, Elem<T>::load(g[i]), Elem<T>::load(p[i]), s));
      for (int k = 0; k < states; ++k) mag[k] = __float_as_uint(s[k]) & 0x7fffffffu;
    }
    block_max3(mag, scratch);
    for (int k = 0; k < states; ++k) {
      const float m = absmax_of_bits(mag[k]);
      if (threadIdx.x == 0) absmax[k][b] = m;
      if (in) codes[k][i] = map[k]->order[sorted_slot(map[k]->mids, scale_to_unit(s[k], m, full))];
    }
  }
}
