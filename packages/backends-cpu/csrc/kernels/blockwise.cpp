#include "kernels/blockwise.h"

#include "kernels/block_scale.h"

namespace bnb {
namespace BNB_ISA_NS {

namespace {

template <DType D>
void quantize_blocks(const typename Elem<D>::T* A, int64_t n, const float* mids, const uint8_t* order,
                     int64_t blocksize, uint8_t* out, float* absmax, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    int64_t start = b * blocksize, len = n - start < blocksize ? n - start : blocksize;
    float m = block_absmax<D>(A + start, len);
    absmax[b] = m;
    BlockScaler scale(m, len == blocksize);
    for (int64_t i = 0; i < len; ++i)
      out[start + i] = order[sorted_slot(mids, 255, scale(Elem<D>::load(A[start + i])))];
  }
}

template <DType D>
void dequantize_range(const uint8_t* A, const float* absmax, const float* code, int64_t blocksize,
                      typename Elem<D>::T* out, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) out[i] = Elem<D>::store(code[A[i]] * absmax[i / blocksize]);
}

}  // namespace

void quantize_blockwise(const void* A, DType dtype, int64_t n, const float* mids, const uint8_t* order,
                        int64_t blocksize, uint8_t* out, float* absmax, int threads) {
  int64_t blocks = (n + blocksize - 1) / blocksize;
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* x = static_cast<const typename Elem<D>::T*>(A);
    parallel_for(blocks, (1 << 16) / blocksize + 1, threads, [&](int64_t b0, int64_t b1) {
      quantize_blocks<D>(x, n, mids, order, blocksize, out, absmax, b0, b1);
    });
  });
}

void dequantize_blockwise(const uint8_t* A, const float* absmax, const float* code, int64_t n, int64_t blocksize,
                          void* out, DType dtype, int threads) {
  visit_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    auto* y = static_cast<typename Elem<D>::T*>(out);
    parallel_for(n, 1 << 16, threads, [&](int64_t i0, int64_t i1) {
      dequantize_range<D>(A, absmax, code, blocksize, y, i0, i1);
    });
  });
}

}  // namespace BNB_ISA_NS
}  // namespace bnb
