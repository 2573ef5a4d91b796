// One-thread timing of the 8-bit optimizer step as compiled from csrc/kernels/optimizers.cpp, for A/B
// comparisons of kernel changes without Python, dispatch or the thread pool (a tool, not a test: `nox -s
// bench` remains the measurement of record). Build and run from packages/backends-cpu, at the AVX-512 level
// (for AVX2: -mavx2 -mfma -mf16c, BNB_ISA_NS=avx2, BNB_ISA_AVX2=1, and -DLEVEL=avx2):
//
//   g++ -std=c++17 -O3 -ffp-contract=off -fno-math-errno -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma \
//       -mf16c -DBNB_ISA_NS=avx512 -DBNB_ISA_AVX512=1 -Icsrc -I../core/src/bitsandbytes/include \
//       bench/optimizer_driver.cpp -o /tmp/optimizer_driver
//   /tmp/optimizer_driver [rule]   # 0 adam, 1 ademamix, 5 lion (csrc/kernels/optimizers.h)
//
// To compare two versions, build each from its own checkout and alternate the binaries a few times: the
// VMs this was used on drift by 20% within minutes. The states are 4096 x 4096 fp32 parameters with the
// dynamic maps' shape (signed for the first moment, unsigned for the second), built here the way
// create_dynamic_map builds them but in double, so the codes differ from upstream's in the last bits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "common.h"

namespace bnb {
// One thread: the step's chunks run in order on the caller.
void parallel_for(int64_t n, int64_t, int, const std::function<void(int64_t, int64_t)>& fn) { fn(0, n); }
}  // namespace bnb

#include "kernels/optimizers.cpp"
#include "nearest_code_build.h"

#ifndef LEVEL
#define LEVEL avx512
#endif

namespace {

void dynamic_map(float* out, bool is_signed) {
  std::vector<double> v;
  const int max_exp = 7;
  for (int i = 0; i < max_exp; ++i) {
    const int items = (1 << (i + (is_signed ? 0 : 1))) + 1;
    for (int j = 0; j + 1 < items; ++j) {
      const double lo = 0.1 + 0.9 * j / (items - 1), hi = 0.1 + 0.9 * (j + 1) / (items - 1);
      const double m = (lo + hi) / 2 * std::pow(10.0, -(max_exp - 1) + i);
      v.push_back(m);
      if (is_signed) v.push_back(-m);
    }
  }
  v.push_back(0.0);
  v.push_back(1.0);
  while (v.size() < 256) v.push_back(0.0);
  std::sort(v.begin(), v.end());
  for (int i = 0; i < 256; ++i) out[i] = float(v[i]);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bnb;
  const int rule = argc > 1 ? std::atoi(argv[1]) : kAdam;
  const int64_t n = int64_t(4096) * 4096, blocks = n / BNB_OPTIMIZER_BLOCKSIZE;
  std::vector<float> g(n), p(n), absmax1(2 * blocks, 1e-3f), absmax2(blocks, 1e-6f);
  std::vector<uint8_t> state1(2 * n), state2(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& x : g) x = normal(rng) * 1e-3f;
  for (float& x : p) x = normal(rng) * 0.02f;
  for (uint8_t& x : state1) x = uint8_t(rng());
  for (uint8_t& x : state2) x = uint8_t(128 + rng() % 128);
  static float qmap1[256], qmap2[256];
  static NearestCode map1, map2;
  dynamic_map(qmap1, true);
  dynamic_map(qmap2, false);
  build_nearest_code(qmap1, map1);
  build_nearest_code(qmap2, map2);

  OptStep st{};
  st.rule = rule;
  st.beta1 = 0.9f, st.one_minus_beta1 = 0.1f, st.beta2 = 0.999f, st.one_minus_beta2 = 0.001f;
  st.beta3 = 0.9999f, st.one_minus_beta3 = 1e-4f, st.alpha = 5.0f, st.eps = 1e-8f;
  st.gnorm_scale = 1.0f, st.lr = 1e-3f, st.decay_factor = 1.0f;
  st.adam_step_size = -1e-3f, st.adam_eps = 1e-8f, st.correction1 = 0.1f, st.correction2 = 0.03f;
  st.map_in_registers = std::getenv("BNB_DRIVER_MAP_IN_REGISTERS") != nullptr;

  std::vector<double> ms;
  for (int it = 0; it < 25; ++it) {
    const auto t0 = std::chrono::steady_clock::now();
    LEVEL::optimizer_update_8bit_blockwise(st, DType::f32, g.data(), p.data(), state1.data(), state2.data(),
                                           absmax1.data(), absmax2.data(), qmap1, qmap2, &map1, &map2, n, 1);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("rule %d, 4096 x 4096, one thread: median %.2f ms, min %.2f ms\n", rule, ms[ms.size() / 2], ms[0]);
  return 0;
}
