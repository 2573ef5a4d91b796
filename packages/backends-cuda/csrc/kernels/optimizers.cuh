// Device helpers of the optimizer kernels (semantics: bitsandbytes/_reference/optimizers.py).
//
// The element math mirrors the reference operation for operation: every product, sum, quotient and
// square root is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), which
// nvcc never contracts into an FMA nor replaces by an approximation, so a GPU produces the same float32
// bits as the reference and the CPU backend; the 8-bit codes then agree byte for byte.
#pragma once

#include <bitsandbytes/formats.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace bnb_optim {

// The update rule of each optimizer name (lamb steps like adam, lars like momentum); the Python side
// (ops/optimizers.py) maps names to these numbers.
enum Rule : int { kAdam = 0, kAdemamix = 1, kMomentum = 2, kRmsprop = 3, kAdagrad = 4, kLion = 5 };

// Bits of the kernels' `flags` argument.
// kScaleByUnorm: scale the 32-bit update by max_unorm's trust ratio read from `unorm` (adagrad and
// ademamix compute the norm but never scale, so whether to scale is not whether `unorm` is given).
// kVector: every 32-bit buffer allows the 4-element vector loads of load4/store4 (the caller checked).
enum Flag : int { kWeightDecay = 1, kSkipZeros = 2, kFirstStep = 4, kScaleByUnorm = 8, kVector = 16 };

constexpr int kBlock = BNB_OPTIMIZER_BLOCKSIZE;  // 8-bit state block; also the threads of every launch
constexpr int kWarps = kBlock / 32;

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }

// g / p elements <-> float32 (exact widening; stores round to nearest even).
template <class T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float load(float x) { return x; }
  __device__ static float store(float x) { return x; }
};
template <>
struct Elem<__half> {
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float x) { return __float2half_rn(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

// Four consecutive elements in one load or store (16 bytes of float, 8 of a 16-bit type); the address
// must be aligned to that size.
template <class T>
struct Quad {
  using V = uint2;
};
template <>
struct Quad<float> {
  using V = float4;
};

template <class T>
__device__ __forceinline__ void load4(const T* ptr, float* out) {
  const typename Quad<T>::V v = *reinterpret_cast<const typename Quad<T>::V*>(ptr);
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = Elem<T>::load(e[k]);
}

template <class T>
__device__ __forceinline__ void store4(T* ptr, const float* in) {
  typename Quad<T>::V v;
  T* e = reinterpret_cast<T*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) e[k] = Elem<T>::store(in[k]);
  *reinterpret_cast<typename Quad<T>::V*>(ptr) = v;
}

// The step's scalars, each already rounded to float32 from the reference's double (Python float) value.
struct Hyper {
  int rule, flags;
  float beta1, omb1, beta2, omb2, beta3, omb3;  // omb: 1 - beta, computed in double
  float alpha, eps, gnorm_scale, lr;
  float weight_decay;  // coupled: g += weight_decay * p
  float decay_factor;  // decoupled: p *= 1 - lr * weight_decay
  float step_size;     // adam: -lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  float adam_eps;      // adam: eps * sqrt(1 - beta2^t)
  float correction1;   // ademamix: 1 - beta1^t
  float correction2;   // ademamix: sqrt(1 - beta2^t)
};

__device__ __forceinline__ int n_states(int rule) { return rule == kAdemamix ? 3 : (rule == kAdam ? 2 : 1); }

// One element's step. `graw` is the gradient as stored (skip_zeros tests it), `scale` the max_unorm
// update scale (1 without). s holds the states ([m, v], [m1, m2, nu] or [s]) and is updated in place;
// returns the new parameter. An element skipped by skip_zeros keeps p and its states.
__device__ __forceinline__ float step_element(const Hyper& h, float scale, float graw, float p0, float* s) {
  float g = mul(graw, h.gnorm_scale);
  float p = p0;
  const bool wd = h.flags & kWeightDecay;
  float s0 = s[0], s1 = s[1], s2 = s[2];
  switch (h.rule) {
    case kAdam: {
      if (wd) p = mul(p, h.decay_factor);
      s0 = add(mul(h.beta1, s0), mul(h.omb1, g));
      s1 = add(mul(h.beta2, s1), mul(mul(h.omb2, g), g));
      p = add(p, mul(mul(scale, h.step_size), div(s0, add(root(s1), h.adam_eps))));
      break;
    }
    case kAdemamix: {
      if (wd) p = mul(p, h.decay_factor);
      s0 = add(mul(h.beta1, s0), mul(h.omb1, g));
      s1 = add(mul(h.beta3, s1), mul(h.omb3, g));
      s2 = add(mul(h.beta2, s2), mul(mul(h.omb2, g), g));
      // The reference's `lr * (m1 / c1 + alpha * m2) / (sqrt(nu) / c2 + eps)`: lr multiplies first.
      float numer = mul(h.lr, add(div(s0, h.correction1), mul(h.alpha, s1)));
      p = sub(p, div(numer, add(div(root(s2), h.correction2), h.eps)));
      break;
    }
    case kLion: {
      if (wd) p = mul(p, h.decay_factor);
      float d = add(mul(h.beta1, s0), mul(h.omb1, g));
      // sign(d) with NaN kept, so a NaN gradient shows in p.
      float sign = d > 0.0f ? 1.0f : (d < 0.0f ? -1.0f : (d != d ? d : 0.0f));
      p = sub(p, mul(mul(scale, h.lr), sign));
      s0 = add(mul(h.beta2, s0), mul(h.omb2, g));
      break;
    }
    default: {  // momentum, rmsprop, adagrad: coupled weight decay
      if (wd) g = add(g, mul(h.weight_decay, p));
      if (h.rule == kMomentum) {
        s0 = (h.flags & kFirstStep) ? g : add(mul(h.beta1, s0), g);
        p = sub(p, mul(mul(scale, h.lr), s0));
      } else {
        s0 = h.rule == kRmsprop ? add(mul(h.beta1, s0), mul(mul(h.omb1, g), g)) : add(s0, mul(g, g));
        float lr = h.rule == kAdagrad ? h.lr : mul(scale, h.lr);  // adagrad never scales (upstream)
        p = sub(p, div(mul(lr, g), add(root(s0), h.eps)));
      }
      break;
    }
  }
  if ((h.flags & kSkipZeros) && graw == 0.0f) return p0;
  s[0] = s0, s[1] = s1, s[2] = s2;
  return p;
}

// The reference's squared-update-norm summand of one element (old states, no weight decay). For
// ademamix it is the plain sum of the old m1 (first) and m2 (second).
__device__ __forceinline__ float norm_term(int rule, bool first_step, const Hyper& h, float norm_c1, float norm_c2,
                                           float graw, const float* s, float* second) {
  float g = mul(graw, h.gnorm_scale);
  switch (rule) {
    case kAdam: {
      float m = div(add(mul(h.beta1, s[0]), mul(h.omb1, g)), norm_c1);
      float v = div(add(mul(h.beta2, s[1]), mul(mul(h.omb2, g), g)), norm_c2);
      float x = div(m, add(root(v), h.eps));
      return mul(x, x);
    }
    case kAdemamix:
      *second = s[1];
      return s[0];
    case kMomentum: {
      float x = first_step ? g : add(mul(h.beta1, s[0]), g);
      return mul(x, x);
    }
    case kLion: {  // the plain sum of beta2 * m_new + (1 - beta2) * g (an upstream quirk)
      float m = add(mul(h.beta2, s[0]), mul(h.omb2, g));
      return add(mul(h.beta2, m), mul(h.omb2, g));
    }
    default: {
      float v = rule == kRmsprop ? add(mul(h.beta1, s[0]), mul(mul(h.omb1, g), g)) : add(s[0], mul(g, g));
      float x = div(g, add(root(v), h.eps));
      return mul(x, x);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// 8-bit state: the nearest-code search of a 256-entry map, built in shared memory by a block of kBlock
// (= 256) threads: a stable value sort by ranks, then the float32 midpoints (v[i] + v[i+1]) / 2.

struct SharedMap {
  float values[256];         // the map as given (dequantization reads it by code)
  float mids[256];           // 255 value-sorted midpoints (the last entry unused)
  unsigned char order[256];  // code of each value-sorted slot
};

// The order of torch.sort, which the reference's stable argsort of the map uses: numbers ascending, then
// every NaN (blockwise.cu's quant_map_prepare sorts the same way). With plain `<` a NaN would rank 0 next to
// the smallest number: two threads writing one slot, and slots nobody writes.
__device__ __forceinline__ bool map_sorts_before(float a, float b) { return a < b || (b != b && a == a); }

// Every thread of the block must call it (it has barriers); `sorted` is 256 floats of scratch.
__device__ __forceinline__ void build_map(const float* __restrict__ qmap, SharedMap& m, float* sorted) {
  const int t = threadIdx.x;
  const float v = qmap[t];
  m.values[t] = v;
  __syncthreads();
  // Entries before this one in a stable sort: earlier in the order, or tied with a lower index; the ranks
  // are then a permutation of 0..255. Maps are normally sorted already (the dynamic maps are): then the
  // rank is the index, and one vote saves the count.
  int rank = t;
  if (!__syncthreads_and(t == 255 || !map_sorts_before(m.values[t + 1], v))) {
    rank = 0;
    for (int j = 0; j < 256; ++j) {
      const float u = m.values[j];
      rank += map_sorts_before(u, v) || (j < t && !map_sorts_before(v, u));
    }
  }
  sorted[rank] = v;
  m.order[rank] = (unsigned char)t;
  __syncthreads();
  if (t < 255) m.mids[t] = mul(add(sorted[t], sorted[t + 1]), 0.5f);
  __syncthreads();
}

// Number of midpoints below s, by an 8-step branchless search (NaN -> 255, as the reference). Its probes
// are those of torch.bucketize's lower bound over the 255 midpoints, so even a map holding NaN (whose
// midpoints are then not monotone) gives the reference's slot.
__device__ __forceinline__ int sorted_slot(const float* mids, float s) {
  int j = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int width = 256 >> k;
    j = 2 * j + int(!(s <= mids[j * width + width / 2 - 1]));
  }
  return j;
}

// Largest of `v` over the block (all kBlock threads call it), each state at once; `scratch` holds
// 3 * kWarps values. Magnitudes compare as unsigned bits: every NaN sorts above inf.
__device__ __forceinline__ void block_max3(unsigned* v, unsigned* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k < 3; ++k)
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v[k] = max(v[k], __shfl_xor_sync(0xffffffffu, v[k], off));
  if (lane == 0)
#pragma unroll
    for (int k = 0; k < 3; ++k) scratch[k * kWarps + warp] = v[k];
  __syncthreads();
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    unsigned m = 0;
    for (int w = 0; w < kWarps; ++w) m = max(m, scratch[k * kWarps + w]);
    v[k] = m;
  }
  __syncthreads();  // scratch is free again
}

// The float32 absmax of magnitude bits (NaN if any element was NaN).
__device__ __forceinline__ float absmax_of_bits(unsigned m) {
  return m > 0x7f800000u ? __int_as_float(0x7fc00000) : __uint_as_float(m);
}

// x scaled into [-1, 1] as the reference scales a block: a full block multiplies by the reciprocal of the
// clamped absmax, the short last block divides by it. NaN stays NaN.
__device__ __forceinline__ float scale_to_unit(float x, float absmax, bool full) {
  float clamped = absmax != absmax ? absmax : fmaxf(absmax, BNB_MIN_SCALE);
  float s = full ? mul(x, div(1.0f, clamped)) : div(x, clamped);
  return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

}  // namespace bnb_optim
