// Element-type conversion through the kernels' own f16/bf16 routines, exposed so the tests can
// compare them with torch on every bit pattern (the quantizers depend on them being exact).
#include "array.h"
#include "bindings.h"

namespace bnb {

BNB_BINDINGS(convert) {
  m.def("_convert", [](Array src, Array dst) {
    DType from = float_dtype(src, "src"), to = float_dtype(dst, "dst");
    int64_t n = numel(src);
    if (numel(dst) != n) throw std::invalid_argument("dst must have as many elements as src");
    visit_dtype(from, [&](auto from_tag) {
      constexpr DType F = decltype(from_tag)::value;
      visit_dtype(to, [&](auto to_tag) {
        constexpr DType T = decltype(to_tag)::value;
        auto* s = static_cast<const typename Elem<F>::T*>(src.data());
        auto* d = static_cast<typename Elem<T>::T*>(dst.data());
        for (int64_t i = 0; i < n; ++i) d[i] = Elem<T>::store(Elem<F>::load(s[i]));
      });
    });
  });
}

}  // namespace bnb
