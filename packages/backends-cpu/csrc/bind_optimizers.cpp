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
#include "nearest_code_build.h"

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
  s.map_in_registers = map_in_registers();
  return s;
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
