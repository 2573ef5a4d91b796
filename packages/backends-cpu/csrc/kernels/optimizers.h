// Optimizer steps with 32-bit and 8-bit blockwise state (semantics: bitsandbytes/_reference/optimizers.py).
#pragma once

#include <bitsandbytes/formats.h>

#include "common.h"
#include "kernels/nearest_code.h"

namespace bnb {

// The update rule an optimizer name runs (lamb steps like adam, lars like momentum; they only add max_unorm).
enum OptRule : int { kAdam = 0, kAdemamix = 1, kMomentum = 2, kRmsprop = 3, kAdagrad = 4, kLion = 5 };

// The scalars of one step, each already rounded to float32 the way the reference rounds it: Python
// arithmetic on the hyperparameters runs in double, and a tensor op casts the result to float32.
struct OptStep {
  int rule;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, beta3, one_minus_beta3, alpha, eps;
  float gnorm_scale, lr;
  bool weight_decay;       // weight_decay > 0: coupled for momentum/rmsprop/adagrad, decoupled otherwise
  float coupled_decay;     // weight_decay (g += weight_decay * p)
  float decay_factor;      // 1 - lr * weight_decay (p *= decay_factor)
  float adam_step_size;    // -lr * sqrt(1 - beta2^t) / (1 - beta1^t)
  float adam_eps;          // eps * sqrt(1 - beta2^t)
  float correction1;       // ademamix: 1 - beta1^t
  float correction2;       // ademamix: sqrt(1 - beta2^t)
  float norm_correction1;  // adam's max_unorm norm: 1 - beta1^t
  float norm_correction2;  //                        1 - beta2^t
  bool first_step;         // momentum: m = g on step 1
  bool skip_zeros;
  // How the AVX-512 8-bit step reads its states' 256-entry maps: from 16 registers rather than by a
  // gather (isa.h's map_in_registers(), read once per call by the binding).
  bool map_in_registers;
};

}  // namespace bnb

#define BNB_OPTIMIZER_DECLS                                                                                         \
  /* state1: [2, n] for ademamix. unorm_vec: null unless max_unorm > 0; limit: max_unorm * param_norm (+eps). */    \
  void optimizer_update_32bit(const OptStep& st, DType dtype, const void* g, void* p, float* state1, float* state2, \
                              int64_t n, float* unorm_vec, float limit, int threads);                               \
  /* state1 / absmax1: [2, n] / [2, blocks] for ademamix; map1/map2 are the searches of qmap1/qmap2. */             \
  void optimizer_update_8bit_blockwise(const OptStep& st, DType dtype, const void* g, void* p, uint8_t* state1,     \
                                       uint8_t* state2, float* absmax1, float* absmax2, const float* qmap1,         \
                                       const float* qmap2, const NearestCode* map1, const NearestCode* map2,        \
                                       int64_t n, int threads);

BNB_FOR_EACH_ISA(BNB_OPTIMIZER_DECLS)
