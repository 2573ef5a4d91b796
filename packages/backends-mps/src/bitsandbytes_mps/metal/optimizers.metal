// Optimizer steps for device mps: optimizer_update_32bit and optimizer_update_8bit_blockwise.
// Semantics: bitsandbytes/_reference/optimizers.py; a port of the CUDA backend's optimizers.cu/.cuh.
//
// Every element operation mirrors the reference's float32 operation in its order (products, sums, then
// precise:: quotients and square roots), so in emulation p, the states and the 8-bit codes are the
// reference's bits. All kernels run threadgroups of 256 threads (one 8-bit state block); the host
// (ops/optimizers.py) computes the step's scalars in double and passes them as one float array `hyper`,
// and the integers (rule, flags, n, ...) as one long array `config`, so a launch binds few buffers.
// The rule is a uniform runtime value: one branch every thread takes the same way costs nothing in
// these memory-bound kernels and keeps one kernel per dtype.
#include <metal_stdlib>
using namespace metal;

// Update rules (lamb steps like adam, lars like momentum) and flag bits; ops/optimizers.py mirrors them.
constant constexpr int kAdam = 0;
constant constexpr int kAdemamix = 1;
constant constexpr int kMomentum = 2;
constant constexpr int kRmsprop = 3;
constant constexpr int kAdagrad = 4;
constant constexpr int kLion = 5;

constant constexpr int kWeightDecay = 1;
constant constexpr int kSkipZeros = 2;
constant constexpr int kFirstStep = 4;
constant constexpr int kScaleByUnorm = 8;  // scale the 32-bit update by max_unorm's trust ratio

// The format constants this file uses (BNB_MIN_SCALE_BITS: the bits of the smallest absmax a block is scaled
// by; BNB_OPTIMIZER_BLOCKSIZE), from bitsandbytes._formats.
// BEGIN GENERATED constants (python -m bitsandbytes_mps.tables._generate; do not edit)
#define BNB_OPTIMIZER_BLOCKSIZE 256
#define BNB_MIN_SCALE_BITS 0x006ce3eeu
// END GENERATED constants

constant constexpr uint kBlock = BNB_OPTIMIZER_BLOCKSIZE;  // threads per threadgroup; also the 8-bit state block
constant constexpr uint kSimds = kBlock / 32;

// Indices into `hyper` (each value already rounded to float32 from the host's double).
constant constexpr int hBeta1 = 0, hOmb1 = 1, hBeta2 = 2, hOmb2 = 3, hBeta3 = 4, hOmb3 = 5;
constant constexpr int hAlpha = 6, hEps = 7, hGnorm = 8, hLr = 9, hWeightDecay = 10;
constant constexpr int hDecayFactor = 11;  // 1 - lr * weight_decay (decoupled decay)
constant constexpr int hStepSize = 12;     // adam: -lr * sqrt(1 - beta2^t) / (1 - beta1^t)
constant constexpr int hAdamEps = 13;      // adam: eps * sqrt(1 - beta2^t)
constant constexpr int hCorrection1 = 14;  // ademamix: 1 - beta1^t
constant constexpr int hCorrection2 = 15;  // ademamix: sqrt(1 - beta2^t)
constant constexpr int hLimit = 16;        // 32-bit step: max_unorm * param_norm (+ eps for one-state rules)
constant constexpr int hNormC1 = 16;       // norm pass: 1 - beta1^t
constant constexpr int hNormC2 = 17;       // norm pass: 1 - beta2^t

// Indices into `config`.
constant constexpr int cRule = 0, cFlags = 1, cN = 2;

inline float div_rn(float a, float b) { return precise::divide(a, b); }
inline float sqrt_rn(float a) { return precise::sqrt(a); }

// NaN and zero are decided on the bits, and no NaN reaches a float comparison whose result matters: fast
// math (PYTORCH_MPS_FAST_MATH=1) lets the compiler assume there is none.
constant constexpr uint kInfBits = 0x7f800000u;
inline uint magnitude_bits(float x) { return as_type<uint>(x) & 0x7fffffffu; }
inline bool nan_bits(float x) { return magnitude_bits(x) > kInfBits; }

// torch.sign keeping NaN (so a NaN gradient shows in p); +0 for either zero.
inline float sign_or_nan(float d) {
  const uint magnitude = magnitude_bits(d);
  if (magnitude > kInfBits) return d;
  if (magnitude == 0u) return 0.0f;
  return as_type<int>(d) < 0 ? -1.0f : 1.0f;
}

inline int n_states(int rule) { return rule == kAdemamix ? 3 : (rule == kAdam ? 2 : 1); }

// One element's step: `graw` as stored (skip_zeros tests it), `scale` the max_unorm update scale (1
// without); s holds [m, v], [m1, m2, nu] or [s] and is updated in place. Returns the new parameter; an
// element skipped by skip_zeros keeps p and its states.
inline float step_element(constant float* h, int rule, int flags, float scale, float graw, float p0, thread float* s) {
  const float g0 = graw * h[hGnorm];
  float g = g0;
  float p = p0;
  const bool wd = (flags & kWeightDecay) != 0;
  float s0 = s[0], s1 = s[1], s2 = s[2];
  if (rule == kAdam) {
    if (wd) p = p * h[hDecayFactor];
    s0 = h[hBeta1] * s0 + h[hOmb1] * g;
    s1 = h[hBeta2] * s1 + (h[hOmb2] * g) * g;
    p = p + (scale * h[hStepSize]) * div_rn(s0, sqrt_rn(s1) + h[hAdamEps]);
  } else if (rule == kAdemamix) {
    if (wd) p = p * h[hDecayFactor];
    s0 = h[hBeta1] * s0 + h[hOmb1] * g;
    s1 = h[hBeta3] * s1 + h[hOmb3] * g;
    s2 = h[hBeta2] * s2 + (h[hOmb2] * g) * g;
    // The reference's lr * (m1 / c1 + alpha * m2) / (sqrt(nu) / c2 + eps): lr multiplies first.
    const float numer = h[hLr] * (div_rn(s0, h[hCorrection1]) + h[hAlpha] * s1);
    p = p - div_rn(numer, div_rn(sqrt_rn(s2), h[hCorrection2]) + h[hEps]);
  } else if (rule == kLion) {
    if (wd) p = p * h[hDecayFactor];
    const float d = h[hBeta1] * s0 + h[hOmb1] * g;
    p = p - (scale * h[hLr]) * sign_or_nan(d);
    s0 = h[hBeta2] * s0 + h[hOmb2] * g;
  } else {  // momentum, rmsprop, adagrad: coupled weight decay
    if (wd) g = g + h[hWeightDecay] * p;
    if (rule == kMomentum) {
      s0 = (flags & kFirstStep) ? g : h[hBeta1] * s0 + g;
      p = p - (scale * h[hLr]) * s0;
    } else {
      s0 = rule == kRmsprop ? h[hBeta1] * s0 + (h[hOmb1] * g) * g : s0 + g * g;
      const float lr = rule == kAdagrad ? h[hLr] : scale * h[hLr];  // adagrad never scales (upstream)
      p = p - div_rn(lr * g, sqrt_rn(s0) + h[hEps]);
    }
  }
  if ((flags & kSkipZeros) && magnitude_bits(graw) == 0u) return p0;
  s[0] = s0;
  s[1] = s1;
  s[2] = s2;
  return p;
}

// The reference's squared-update-norm summand of one element (old states, no weight decay). ademamix:
// the plain sums of the old m1 (returned) and m2 (`second`); lion: the plain sum of beta2*m_new + (1-beta2)g.
inline float norm_term(constant float* h, int rule, int flags, float graw, thread const float* s, thread float& second) {
  const float g = graw * h[hGnorm];
  if (rule == kAdam) {
    const float m = div_rn(h[hBeta1] * s[0] + h[hOmb1] * g, h[hNormC1]);
    const float v = div_rn(h[hBeta2] * s[1] + (h[hOmb2] * g) * g, h[hNormC2]);
    const float x = div_rn(m, sqrt_rn(v) + h[hEps]);
    return x * x;
  }
  if (rule == kAdemamix) {
    second = s[1];
    return s[0];
  }
  if (rule == kMomentum) {
    const float x = (flags & kFirstStep) ? g : h[hBeta1] * s[0] + g;
    return x * x;
  }
  if (rule == kLion) {
    const float m = h[hBeta2] * s[0] + h[hOmb2] * g;
    return h[hBeta2] * m + h[hOmb2] * g;
  }
  const float v = rule == kRmsprop ? h[hBeta1] * s[0] + (h[hOmb1] * g) * g : s[0] + g * g;
  const float x = div_rn(g, sqrt_rn(v) + h[hEps]);
  return x * x;
}

// Sum of `x` over the threadgroup (every thread calls it; lane order inside a SIMD-group, then SIMD-group
// order), returned to every thread. `red` holds kSimds floats.
inline float group_sum(float x, threadgroup float* red, uint lid) {
  x = simd_sum(x);
  if (lid % 32 == 0) red[lid / 32] = x;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = red[0];
  for (uint w = 1; w < kSimds; ++w) total = total + red[w];
  threadgroup_barrier(mem_flags::mem_threadgroup);  // red is free again
  return total;
}

// ---------------------------------------------------------------------------------------------------
// 32-bit state

// Pass 1 of max_unorm: the threadgroups stride over the elements; each writes its partial sum of the
// squared update norm to partials[group] (ademamix: the m2 sum to partials[groups + group]). Reads only.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void optimizer_32bit_norm(device const T* g [[buffer(0)]],
                                 device const float* state1 [[buffer(1)]],
                                 device const float* state2 [[buffer(2)]],
                                 device float* partials [[buffer(3)]],
                                 constant float* hyper [[buffer(4)]],
                                 constant long* config [[buffer(5)]],
                                 uint gid [[thread_position_in_grid]],
                                 uint group [[threadgroup_position_in_grid]],
                                 uint groups [[threadgroups_per_grid]],
                                 uint lid [[thread_index_in_threadgroup]]) {
  threadgroup float red[kSimds];
  const int rule = int(config[cRule]), flags = int(config[cFlags]);
  const long n = config[cN];
  float acc = 0.0f, acc2 = 0.0f;
  for (long i = gid; i < n; i += long(groups) * kBlock) {
    float s[3] = {state1[i], 0.0f, 0.0f};
    if (rule == kAdam) s[1] = state2[i];
    if (rule == kAdemamix) s[1] = state1[n + i];
    float second = 0.0f;
    acc = acc + norm_term(hyper, rule, flags, float(g[i]), s, second);
    acc2 = acc2 + second;
  }
  acc = group_sum(acc, red, lid);
  acc2 = group_sum(acc2, red, lid);
  if (lid == 0) {
    partials[group] = acc;
    partials[groups + group] = acc2;
  }
}

// Pass 2 of max_unorm, one threadgroup: unorm[0] = the sum of the `count` partials; for ademamix (`two`)
// plus the sum of the second row, each summed on its own first as the reference adds them.
// config = [count, two].
[[max_total_threads_per_threadgroup(256)]] kernel void optimizer_32bit_norm_total(device const float* partials [[buffer(0)]],
                                       device float* unorm [[buffer(1)]],
                                       constant long* config [[buffer(2)]],
                                       uint lid [[thread_index_in_threadgroup]]) {
  threadgroup float red[kSimds];
  const long count = config[0];
  float a = 0.0f, b = 0.0f;
  for (long i = lid; i < count; i += kBlock) {
    a = a + partials[i];
    b = b + partials[count + i];
  }
  a = group_sum(a, red, lid);
  b = group_sum(b, red, lid);
  if (lid == 0) unorm[0] = config[1] != 0 ? a + b : a;
}

// The step, one thread per element (a non-uniform grid of exactly n threads: no tail to guard). With
// kScaleByUnorm, `unorm` holds the squared norm the trust ratio comes from (this step's, or for lion the
// previous step's); otherwise it is not read. ademamix keeps [m1 | m2] in state1 and nu in state2.
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void optimizer_32bit(device const T* g [[buffer(0)]],
                            device T* p [[buffer(1)]],
                            device float* state1 [[buffer(2)]],
                            device float* state2 [[buffer(3)]],
                            device const float* unorm [[buffer(4)]],
                            constant float* hyper [[buffer(5)]],
                            constant long* config [[buffer(6)]],
                            uint gid [[thread_position_in_grid]]) {
  const int rule = int(config[cRule]), flags = int(config[cFlags]);
  const long n = config[cN];
  const long i = gid;
  if (i >= n) return;
  float scale = 1.0f;
  if (flags & kScaleByUnorm) {
    const float current = sqrt_rn(unorm[0]);
    // limit / current as torch computes a scalar over a tensor: reciprocal, then a product.
    if (!nan_bits(current) && current > hyper[hLimit]) scale = div_rn(1.0f, current) * hyper[hLimit];
  }
  device float* second = rule == kAdemamix ? state1 + n : state2;
  const bool two = rule == kAdam || rule == kAdemamix, three = rule == kAdemamix;
  float s[3] = {state1[i], two ? second[i] : 0.0f, three ? state2[i] : 0.0f};
  p[i] = T(step_element(hyper, rule, flags, scale, float(g[i]), float(p[i]), s));
  state1[i] = s[0];
  if (two) second[i] = s[1];
  if (three) state2[i] = s[2];
}

// ---------------------------------------------------------------------------------------------------
// 8-bit blockwise state: one pass per block of kBlock states, thread t owning element t of the block:
// dequantize (qmap[code] * absmax), step in float32, write p, then each new state's absmax (a block max
// of magnitude bits) and its nearest codes. Threadgroups stride over the blocks, so the sorted maps are
// built once per threadgroup, not once per block. ademamix keeps [m1 | m2] in state1 / absmax1 and nu in
// state2 / absmax2; one-state rules never touch state2, absmax2 or qmap2.

// The reference's order of map values (a stable sort): numbers by value, NaN after every number.
inline bool sorts_before(float a, float b) { return !nan_bits(a) && (nan_bits(b) || a < b); }

// A 256-entry map in threadgroup memory for the nearest-code search: the values by code, the 255 value-
// sorted midpoints (v[i] + v[i+1]) / 2 and the code of each sorted slot. Every thread of the group calls
// it (it has barriers). `sorted` is 256 floats of scratch, `votes` kSimds uints. A NaN midpoint (next to
// a NaN entry) is stored as -inf: the reference's search (torch.bucketize) goes right at a NaN boundary,
// as sorted_slot does at -inf, which then never compares with a NaN.
inline void build_map(device const float* qmap, threadgroup float* values, threadgroup float* mids,
                      threadgroup uchar* order, threadgroup float* sorted, threadgroup uint* votes, uint t) {
  const float v = qmap[t];
  values[t] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // Rank in a stable sort: entries smaller, or equal with a lower index. The dynamic maps are sorted
  // already (rank = index); one vote saves the count then.
  const bool in_order = t == kBlock - 1 || !sorts_before(values[t + 1], v);
  const bool all_in_order = simd_all(in_order);
  if (t % 32 == 0) votes[t / 32] = all_in_order ? 1u : 0u;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  bool sorted_map = true;
  for (uint w = 0; w < kSimds; ++w) sorted_map = sorted_map && votes[w] != 0u;
  uint rank = t;
  if (!sorted_map) {
    rank = 0;
    for (uint j = 0; j < kBlock; ++j) {
      const float u = values[j];
      rank += (sorts_before(u, v) || (j < t && !sorts_before(v, u))) ? 1u : 0u;
    }
  }
  sorted[rank] = v;
  order[rank] = uchar(t);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t < kBlock - 1) {
    const float lo = sorted[t], hi = sorted[t + 1];
    // lo + hi is NaN for a NaN or for -inf + inf (lo <= hi): decided on the bits, not on a computed NaN.
    const bool nan_mid = nan_bits(lo) || nan_bits(hi) || (as_type<uint>(lo) == 0xff800000u && as_type<uint>(hi) == kInfBits);
    mids[t] = nan_mid ? as_type<float>(0xff800000u) : (lo + hi) * 0.5f;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}

// Number of midpoints below s, by an 8-step branchless search (NaN -> 255, as the reference).
inline uint sorted_slot(threadgroup const float* mids, float s) {
  if (nan_bits(s)) return 255u;
  uint j = 0;
  for (uint k = 0; k < 8; ++k) {
    const uint width = 256u >> k;
    j = 2 * j + ((s <= mids[j * width + width / 2 - 1]) ? 0u : 1u);
  }
  return j;
}

// x scaled into [-1, 1] as the reference scales a block: a full block multiplies by the reciprocal of the
// clamped absmax, the short last block divides by it. absmax is the block's max |x| (its magnitude bits, a
// NaN anywhere in the block made it NaN). The special cases are taken on the bits, so the arithmetic below
// sees finite numbers only: NaN and inf values (their block's absmax is inf or NaN: inf / inf, NaN) and a
// NaN absmax give NaN; a finite value in a block whose absmax is inf gives 0 (the
// reference's +-0: the same code).
inline float scale_to_unit(float x, float absmax, bool full) {
  const uint a = as_type<uint>(absmax);
  // An all-zero block: the reference's x / MIN_SCALE is x (a signed zero). Said directly, because MIN_SCALE
  // is a float32 subnormal, which a GPU that flushes subnormals would turn into a division by zero.
  if (a == 0u) return x;
  if (a >= kInfBits || magnitude_bits(x) >= kInfBits) {
    return magnitude_bits(x) >= kInfBits || a > kInfBits ? as_type<float>(0x7fc00000u) : 0.0f;
  }
  // A subnormal clamped absmax c (MIN_SCALE is one) is 0 to a GPU that flushes subnormals: 1 / c = inf,
  // x * inf = NaN. Then every x of the block is subnormal or zero too, x = mx * 2**-149 and c = mc *
  // 2**-149 with integer mantissas below 2**23: x / c = mx / mc, and x * round(1 / c) = mx * round(1 / mc)
  // exactly (1 / mc and the product are normal, so rounding commutes with the power of two). Scaling the
  // mantissas, read off the bits, gives the reference's bits whether or not the GPU flushes.
  const uint c = max(a, BNB_MIN_SCALE_BITS);
  float clamped = as_type<float>(c);
  if (c < 0x00800000u) {
    const uint b = as_type<uint>(x);
    x = as_type<float>(as_type<uint>(float(b & 0x007fffffu)) | (b & 0x80000000u));  // sign on the bits: -0
    clamped = float(c);
  }
  const float s = full ? x * div_rn(1.0f, clamped) : div_rn(x, clamped);
  return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void optimizer_8bit_blockwise(device const T* g [[buffer(0)]],
                                     device T* p [[buffer(1)]],
                                     device uchar* state1 [[buffer(2)]],
                                     device uchar* state2 [[buffer(3)]],
                                     device float* absmax1 [[buffer(4)]],
                                     device float* absmax2 [[buffer(5)]],
                                     device const float* qmap1 [[buffer(6)]],
                                     device const float* qmap2 [[buffer(7)]],
                                     constant float* hyper [[buffer(8)]],
                                     constant long* config [[buffer(9)]],
                                     uint group [[threadgroup_position_in_grid]],
                                     uint groups [[threadgroups_per_grid]],
                                     uint t [[thread_index_in_threadgroup]]) {
  threadgroup float values[2 * kBlock];
  threadgroup float mids[2 * kBlock];
  threadgroup uchar order[2 * kBlock];
  threadgroup float sorted[kBlock];
  threadgroup uint votes[kSimds];
  threadgroup uint scratch[3 * kSimds];

  const int rule = int(config[cRule]), flags = int(config[cFlags]);
  const long n = config[cN];
  const int states = n_states(rule);
  build_map(qmap1, values, mids, order, sorted, votes, t);
  if (states > 1) build_map(qmap2, values + kBlock, mids + kBlock, order + kBlock, sorted, votes, t);

  const long blocks = (n + kBlock - 1) / kBlock;
  // Where state k's codes and absmax live, and which map (0: qmap1, 1: qmap2) it uses.
  const bool ademamix = rule == kAdemamix;
  const long code_off[3] = {0, ademamix ? n : 0, 0};
  const long absmax_off[3] = {0, ademamix ? blocks : 0, 0};
  const uint map_of[3] = {0u, ademamix ? 0u : 1u, 1u};
  const bool in_state1[3] = {true, ademamix, false};

  for (long b = group; b < blocks; b += groups) {
    const long i = b * kBlock + t;
    const bool in = i < n;
    const bool full = (b + 1) * kBlock <= n;
    float s[3] = {0.0f, 0.0f, 0.0f};
    uint mag[3] = {0u, 0u, 0u};
    if (in) {
      for (int k = 0; k < states; ++k) {
        const uchar code = in_state1[k] ? state1[code_off[k] + i] : state2[i];
        const float scale = in_state1[k] ? absmax1[absmax_off[k] + b] : absmax2[b];
        s[k] = values[map_of[k] * kBlock + code] * scale;
      }
      p[i] = T(step_element(hyper, rule, flags, 1.0f, float(g[i]), float(p[i]), s));
      for (int k = 0; k < states; ++k) mag[k] = as_type<uint>(s[k]) & 0x7fffffffu;
    }
    // Block max of each state's magnitude bits (every NaN sorts above inf).
    for (int k = 0; k < 3; ++k) {
      const uint m = simd_max(mag[k]);
      if (t % 32 == 0) scratch[k * kSimds + t / 32] = m;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int k = 0; k < 3; ++k) {
      uint m = 0u;
      for (uint w = 0; w < kSimds; ++w) m = max(m, scratch[k * kSimds + w]);
      mag[k] = m;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);  // scratch is free for the next block
    for (int k = 0; k < states; ++k) {
      const float m = mag[k] > 0x7f800000u ? as_type<float>(0x7fc00000u) : as_type<float>(mag[k]);
      if (t == 0) {
        if (in_state1[k]) {
          absmax1[absmax_off[k] + b] = m;
        } else {
          absmax2[b] = m;
        }
      }
      if (in) {
        const uint mk = map_of[k] * kBlock;
        const uchar code = order[mk + sorted_slot(mids + mk, scale_to_unit(s[k], m, full))];
        if (in_state1[k]) {
          state1[code_off[k] + i] = code;
        } else {
          state2[i] = code;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Instantiations: host names <kernel>_<f32|f16|bf16> (tables/optimizers.py lists them). bfloat needs
// MSL 3.1 (macOS 14); BNB_HAS_BFLOAT (the prelude of _assemble.py) keeps the library compiling where it
// is missing, the bf16 ops then run on the reference.

template [[host_name("optimizer_32bit_norm_f32")]] kernel void optimizer_32bit_norm<float>(
    device const float* g [[buffer(0)]], device const float* state1 [[buffer(1)]],
    device const float* state2 [[buffer(2)]], device float* partials [[buffer(3)]],
    constant float* hyper [[buffer(4)]], constant long* config [[buffer(5)]],
    uint gid [[thread_position_in_grid]], uint group [[threadgroup_position_in_grid]],
    uint groups [[threadgroups_per_grid]], uint lid [[thread_index_in_threadgroup]]);
template [[host_name("optimizer_32bit_norm_f16")]] kernel void optimizer_32bit_norm<half>(
    device const half* g [[buffer(0)]], device const float* state1 [[buffer(1)]],
    device const float* state2 [[buffer(2)]], device float* partials [[buffer(3)]],
    constant float* hyper [[buffer(4)]], constant long* config [[buffer(5)]],
    uint gid [[thread_position_in_grid]], uint group [[threadgroup_position_in_grid]],
    uint groups [[threadgroups_per_grid]], uint lid [[thread_index_in_threadgroup]]);

template [[host_name("optimizer_32bit_f32")]] kernel void optimizer_32bit<float>(
    device const float* g [[buffer(0)]], device float* p [[buffer(1)]], device float* state1 [[buffer(2)]],
    device float* state2 [[buffer(3)]], device const float* unorm [[buffer(4)]],
    constant float* hyper [[buffer(5)]], constant long* config [[buffer(6)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("optimizer_32bit_f16")]] kernel void optimizer_32bit<half>(
    device const half* g [[buffer(0)]], device half* p [[buffer(1)]], device float* state1 [[buffer(2)]],
    device float* state2 [[buffer(3)]], device const float* unorm [[buffer(4)]],
    constant float* hyper [[buffer(5)]], constant long* config [[buffer(6)]],
    uint gid [[thread_position_in_grid]]);

template [[host_name("optimizer_8bit_blockwise_f32")]] kernel void optimizer_8bit_blockwise<float>(
    device const float* g [[buffer(0)]], device float* p [[buffer(1)]], device uchar* state1 [[buffer(2)]],
    device uchar* state2 [[buffer(3)]], device float* absmax1 [[buffer(4)]], device float* absmax2 [[buffer(5)]],
    device const float* qmap1 [[buffer(6)]], device const float* qmap2 [[buffer(7)]],
    constant float* hyper [[buffer(8)]], constant long* config [[buffer(9)]],
    uint group [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
    uint t [[thread_index_in_threadgroup]]);
template [[host_name("optimizer_8bit_blockwise_f16")]] kernel void optimizer_8bit_blockwise<half>(
    device const half* g [[buffer(0)]], device half* p [[buffer(1)]], device uchar* state1 [[buffer(2)]],
    device uchar* state2 [[buffer(3)]], device float* absmax1 [[buffer(4)]], device float* absmax2 [[buffer(5)]],
    device const float* qmap1 [[buffer(6)]], device const float* qmap2 [[buffer(7)]],
    constant float* hyper [[buffer(8)]], constant long* config [[buffer(9)]],
    uint group [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
    uint t [[thread_index_in_threadgroup]]);

#if BNB_HAS_BFLOAT
template [[host_name("optimizer_32bit_norm_bf16")]] kernel void optimizer_32bit_norm<bfloat>(
    device const bfloat* g [[buffer(0)]], device const float* state1 [[buffer(1)]],
    device const float* state2 [[buffer(2)]], device float* partials [[buffer(3)]],
    constant float* hyper [[buffer(4)]], constant long* config [[buffer(5)]],
    uint gid [[thread_position_in_grid]], uint group [[threadgroup_position_in_grid]],
    uint groups [[threadgroups_per_grid]], uint lid [[thread_index_in_threadgroup]]);
template [[host_name("optimizer_32bit_bf16")]] kernel void optimizer_32bit<bfloat>(
    device const bfloat* g [[buffer(0)]], device bfloat* p [[buffer(1)]], device float* state1 [[buffer(2)]],
    device float* state2 [[buffer(3)]], device const float* unorm [[buffer(4)]],
    constant float* hyper [[buffer(5)]], constant long* config [[buffer(6)]],
    uint gid [[thread_position_in_grid]]);
template [[host_name("optimizer_8bit_blockwise_bf16")]] kernel void optimizer_8bit_blockwise<bfloat>(
    device const bfloat* g [[buffer(0)]], device bfloat* p [[buffer(1)]], device uchar* state1 [[buffer(2)]],
    device uchar* state2 [[buffer(3)]], device float* absmax1 [[buffer(4)]], device float* absmax2 [[buffer(5)]],
    device const float* qmap1 [[buffer(6)]], device const float* qmap2 [[buffer(7)]],
    constant float* hyper [[buffer(8)]], constant long* config [[buffer(9)]],
    uint group [[threadgroup_position_in_grid]], uint groups [[threadgroups_per_grid]],
    uint t [[thread_index_in_threadgroup]]);
#endif
