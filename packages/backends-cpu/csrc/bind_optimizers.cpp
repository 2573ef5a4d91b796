#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "array.h"
#include "bindings.h"
#include "isa.h"
#include "kernels/optimizers.h"

namespace bnb {
namespace {

constexpr int64_t kBlock = BNB_OPTIMIZER_BLOCKSIZE;

struct Name {
  const char* name;
  int rule;
  int states;      // 2: keeps state2 (adam, lamb, ademamix)
  bool one_state;  // max_unorm's limit adds eps
};
constexpr Name kNames[] = {
    {"adam", kAdam, 2, false},        {"lamb", kAdam, 2, false},    {"ademamix", kAdemamix, 2, false},
    {"momentum", kMomentum, 1, true}, {"lars", kMomentum, 1, true}, {"rmsprop", kRmsprop, 1, true},
    {"adagrad", kAdagrad, 1, true},   {"lion", kLion, 1, true},
};

const Name& lookup(const std::string& name) {
  for (const auto& n : kNames)
    if (name == n.name) return n;
  throw std::invalid_argument(
      "optimizer_name must be one of adam, momentum, rmsprop, lion, adagrad, ademamix, "
      "lamb, lars; got '" +
      name + "'");
}

// The step's scalars, computed as the reference computes them: in double (Python floats), then rounded
// once to float32 where a tensor op meets them.
OptStep make_step(const Name& opt, double beta1, double beta2, double beta3, double alpha, double eps,
                  double weight_decay, int64_t step, double lr, double gnorm_scale, bool skip_zeros) {
  if (step < 1) throw std::invalid_argument("step must be an int >= 1; got " + std::to_string(step));
  OptStep s{};
  s.rule = opt.rule;
  s.beta1 = float(beta1), s.one_minus_beta1 = float(1.0 - beta1);
  s.beta2 = float(beta2), s.one_minus_beta2 = float(1.0 - beta2);
  s.beta3 = float(beta3), s.one_minus_beta3 = float(1.0 - beta3);
  s.alpha = float(alpha), s.eps = float(eps);
  s.gnorm_scale = float(gnorm_scale), s.lr = float(lr);
  s.weight_decay = weight_decay > 0.0;
  s.coupled_decay = float(weight_decay);
  s.decay_factor = float(1.0 - lr * weight_decay);
  double t = double(step);
  double c1 = 1.0 - std::pow(beta1, t), c2 = std::sqrt(1.0 - std::pow(beta2, t));
  s.adam_step_size = float(-lr * c2 / c1);
  s.adam_eps = float(eps * c2);
  s.correction1 = float(c1), s.correction2 = float(c2);
  s.norm_correction1 = float(1.0 - std::pow(beta1, t));
  s.norm_correction2 = float(1.0 - std::pow(beta2, t));
  s.first_step = step == 1;
  s.skip_zeros = skip_zeros;
  return s;
}

// Sweeps the keys of `shift` in increasing value order, with two pointers giving each key's first slot (that
// of its smallest value) and last slot (that of its largest, values capped at 1). Fills m.entry when `fill`;
// returns the most slots past the first that a key reaches, flagged keys excluded (those are counted in *flags).
int sweep_keys(NearestCode& m, int shift, uint32_t floor_bits, bool fill, int* flags, int* width) {
  const uint32_t one = 0x3f800000u, low_mask = (1u << shift) - 1;
  const int keys = int((one - floor_bits) >> shift) + 1;
  int lo_ptr = 0, hi_ptr = 0, widest = 0;
  *flags = 0, *width = 0;
  auto advance = [&](int& ptr, float v) {
    while (ptr < 255 && m.mids[ptr] < v) ++ptr;
    return ptr;
  };
  auto visit = [&](int k, bool negative) {
    uint32_t small = k == 0 ? 0u : floor_bits + (uint32_t(k) << shift);
    uint32_t large = std::min(floor_bits + ((uint32_t(k) + 1) << shift) - 1, one);
    float smallest = bits_to_float(negative ? (large | 0x80000000u) : small);
    float largest = bits_to_float(negative ? (small | 0x80000000u) : large);
    int lo = advance(lo_ptr, smallest), hi = advance(hi_ptr, largest);
    // The bits above `shift` are shared by a key's values, except in the merged key 0 below the floor.
    bool shared_prefix = k != 0 || floor_bits == 0;
    bool flag = hi - lo >= 2 || (hi > lo && !shared_prefix);
    uint32_t threshold = low_mask;
    if (flag) {
      ++*flags;
      *width = std::max(*width, hi - lo);
    } else if (hi > lo) {  // the one midpoint inside: smallest <= mids[lo] < largest
      threshold = float_to_bits(m.mids[lo]) & low_mask;
      if (negative) threshold ^= low_mask;
      widest = std::max(widest, 1);
    }
    if (fill) m.entry[k + (negative ? keys : 0)] = uint32_t(lo) | (flag ? 0x100u : 0u) | (threshold << (32 - shift));
  };
  for (int k = keys - 1; k >= 0; --k) visit(k, true);  // -1 .. -0
  for (int k = 0; k < keys; ++k) visit(k, false);      // +0 .. 1
  return widest;
}

// The nearest-code search of a map: midpoints exactly as SortedMap in bind_blockwise.cpp (stable value
// sort, float32 (a + b) / 2), plus the key table (see NearestCode).
void build_nearest_code(const float* code, NearestCode& m) {
  int idx[256];
  std::iota(idx, idx + 256, 0);
  std::stable_sort(idx, idx + 256, [&](int a, int b) { return code[a] < code[b]; });
  m.identity = true;
  for (int i = 0; i < 256; ++i) {
    m.order[i] = idx[i];
    m.identity &= idx[i] == i;
  }
  for (int i = 0; i < 255; ++i) m.mids[i] = (code[idx[i]] + code[idx[i + 1]]) / 2.0f;
  m.mids[255] = INFINITY;
  // The floor: the exponent of the smallest non-zero |midpoint| (finite ones; 0 if there is none).
  uint32_t smallest = 0x7f800000u;
  for (int i = 0; i < 255; ++i) {
    uint32_t a = float_to_bits(m.mids[i]) & 0x7fffffffu;
    if (a != 0 && a < smallest) smallest = a;
  }
  uint32_t base = smallest >= 0x3f800000u ? 0x3f800000u : smallest & 0x7f800000u;
  // The largest shift (smallest table) whose keys all reach at most two slots; else the finest that fits.
  int chosen = -1;
  for (int shift = 21; shift >= 8; --shift) {
    uint32_t floor_bits = base > (1u << shift) ? base - (1u << shift) : 0u;
    int keys = int((0x3f800000u - floor_bits) >> shift) + 1;
    if (2 * keys > NearestCode::kMaxEntries) break;
    chosen = shift;
    int flags, width;
    sweep_keys(m, shift, floor_bits, false, &flags, &width);
    if (flags == 0) break;
  }
  if (chosen < 0) chosen = 21;  // unreachable: shift 21 always fits
  m.shift = chosen;
  m.floor_bits = base > (1u << chosen) ? base - (1u << chosen) : 0u;
  m.keys = int((0x3f800000u - m.floor_bits) >> chosen) + 1;
  int flags, width;
  sweep_keys(m, chosen, m.floor_bits, true, &flags, &width);
  m.flagged = flags > 0;
  m.width = width;
}

// Maps repeat across calls (the dynamic maps): keep the last one per thread and argument (qmap1: 0, qmap2: 1),
// so the two searches of one call never evict each other.
const NearestCode& nearest_code(const float* code, int which) {
  struct Entry {
    float code[256];
    NearestCode map;
    bool valid = false;
  };
  thread_local std::unique_ptr<Entry> cache[2];  // on the heap: ~70 KB each
  if (!cache[which]) cache[which] = std::make_unique<Entry>();
  Entry& e = *cache[which];
  if (e.valid && std::memcmp(e.code, code, sizeof e.code) == 0) return e.map;
  std::memcpy(e.code, code, sizeof e.code);
  build_nearest_code(code, e.map);
  e.valid = true;
  return e.map;
}

void check_params(Array& g, Array& p, DType* dt) {
  *dt = float_dtype(g, "g");
  if (float_dtype(p, "p") != *dt) throw std::invalid_argument("p must have the dtype of g");
  if (numel(p) != numel(g))
    throw std::invalid_argument("g must have as many elements as p (" + std::to_string(numel(p)) + "); got " +
                                std::to_string(numel(g)));
}

}  // namespace

BNB_BINDINGS(optimizers) {
  m.def("optimizer_update_32bit",
        [](const std::string& name, Array g, Array p, Array state1, std::optional<Array> state2,
           std::optional<Array> unorm_vec, double max_unorm, double param_norm, double beta1, double beta2,
           double beta3, double alpha, double eps, double weight_decay, int64_t step, double lr, double gnorm_scale,
           bool skip_zeros, int threads) {
          const Name& opt = lookup(name);
          OptStep st = make_step(opt, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros);
          DType dt;
          check_params(g, p, &dt);
          int64_t n = numel(p);
          float* s1 = f32(state1, "state1", opt.rule == kAdemamix ? 2 * n : n);
          float* s2 = nullptr;
          if (opt.states == 2) {
            if (!state2) throw std::invalid_argument("optimizer '" + name + "' keeps two states; state2 must be given");
            s2 = f32(*state2, "state2", n);
          }
          float* unorm = nullptr;
          float limit = 0.0f;
          if (max_unorm > 0.0) {
            if (!unorm_vec) throw std::invalid_argument("unorm_vec is required when max_unorm > 0");
            unorm = f32(*unorm_vec, "unorm_vec", 1);
            limit = float(max_unorm * param_norm + (opt.one_state ? eps : 0.0));
          }
          const void* gp = g.data();
          void* pp = p.data();
          nb::gil_scoped_release release;
          BNB_DISPATCH(optimizer_update_32bit, st, dt, gp, pp, s1, s2, n, unorm, limit, threads);
        });

  m.def("optimizer_update_8bit_blockwise",
        [](const std::string& name, Array g, Array p, Array state1, std::optional<Array> state2, double beta1,
           double beta2, double beta3, double alpha, double eps, int64_t step, double lr, Array qmap1,
           std::optional<Array> qmap2, Array absmax1, std::optional<Array> absmax2, double weight_decay,
           double gnorm_scale, bool skip_zeros, int threads) {
          const Name& opt = lookup(name);
          OptStep st = make_step(opt, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros);
          DType dt;
          check_params(g, p, &dt);
          int64_t n = numel(p), blocks = n_blocks(n, kBlock);
          int n_ema = opt.rule == kAdemamix ? 2 : 1;
          uint8_t* s1 = u8(state1, "state1", n_ema * n);
          float* a1 = f32(absmax1, "absmax1", n_ema * blocks);
          const float* q1 = f32(qmap1, "qmap1", 256);
          uint8_t* s2 = nullptr;
          float* a2 = nullptr;
          const float* q2 = nullptr;
          if (opt.states == 2) {
            if (!state2 || !qmap2 || !absmax2)
              throw std::invalid_argument("optimizer '" + name +
                                          "' keeps two states; state2, qmap2 and absmax2 "
                                          "must be given");
            s2 = u8(*state2, "state2", n);
            a2 = f32(*absmax2, "absmax2", blocks);
            q2 = f32(*qmap2, "qmap2", 256);
          }
          const void* gp = g.data();
          void* pp = p.data();
          nb::gil_scoped_release release;
          const NearestCode* m1 = &nearest_code(q1, 0);
          const NearestCode* m2 = q2 ? &nearest_code(q2, 1) : nullptr;
          BNB_DISPATCH(optimizer_update_8bit_blockwise, st, dt, gp, pp, s1, s2, a1, a2, q1, q2, m1, m2, n, threads);
        });
}

}  // namespace bnb
