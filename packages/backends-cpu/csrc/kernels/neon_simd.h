// AArch64 Advanced SIMD helpers the NEON kernels share (included only where BNB_ISA_NEON is defined):
// loads of the three float formats widened to float32, stores rounding float32 back exactly as
// Elem<D>::store does, and the byte-plane table lookups behind the 4-bit decoders.
#pragma once

#if !defined(BNB_ISA_NEON)
#error "neon_simd.h is for the NEON ISA levels only"
#endif

#include <arm_neon.h>

#include "common.h"

namespace bnb {
namespace BNB_ISA_NS {
namespace neon_simd {

// 4 consecutive elements widened to float32: exact for all three formats (f16 and bf16 embed in f32;
// FCVTL keeps f16 subnormals, as FPCR.FZ16 is clear on every OS we target).
template <DType D>
inline float32x4_t load4(const typename Elem<D>::T* p) {
  if constexpr (D == DType::f32) {
    return vld1q_f32(p);
  } else if constexpr (D == DType::f16) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
  } else {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
  }
}

// 4 floats rounded to bf16 bits exactly as float_to_bf16: nearest even on the bits, NaN -> (u >> 16) | 0x40.
// (BFCVTN's handling of subnormals depends on FEAT_EBF16 and FPCR, so it is not used.)
inline uint16x4_t round_bf16(float32x4_t v) {
  const uint32x4_t u = vreinterpretq_u32_f32(v);
  const uint32x4_t hi = vshrq_n_u32(u, 16);
  uint32x4_t r = vaddq_u32(vaddq_u32(u, vdupq_n_u32(0x7fff)), vandq_u32(hi, vdupq_n_u32(1)));
  r = vshrq_n_u32(r, 16);
  const uint32x4_t nan = vmvnq_u32(vceqq_f32(v, v));
  r = vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40)), r);
  return vmovn_u32(r);
}

// 4 floats rounded to f16 bits exactly as float_to_f16: FCVTN rounds to nearest even (FPCR.RMode is
// round-to-nearest unless a program changes it), keeps subnormals, overflows to inf and quiets NaN keeping
// the top payload bits.
inline uint16x4_t round_f16(float32x4_t v) { return vreinterpret_u16_f16(vcvt_f16_f32(v)); }

template <DType D>
inline void store4(typename Elem<D>::T* p, float32x4_t v) {
  if constexpr (D == DType::f32) {
    vst1q_f32(p, v);
  } else if constexpr (D == DType::f16) {
    vst1_u16(p, round_f16(v));
  } else {
    vst1_u16(p, round_bf16(v));
  }
}

// A 16-entry table of 32-bit values split into its four byte planes: plane j holds byte j of every
// entry, so one TBL per plane looks up 16 codes and the planes interleaved again are the 16 values.
struct Planes32 {
  uint8x16x4_t p;
  explicit Planes32(const float* tab) : p(vld4q_u8(reinterpret_cast<const uint8_t*>(tab))) {}
  // The values of 16 codes (each < 16) in code order, as four float32x4_t.
  inline void lookup(uint8x16_t idx, float32x4_t out[4]) const {
    const uint8x16_t b0 = vqtbl1q_u8(p.val[0], idx), b1 = vqtbl1q_u8(p.val[1], idx);
    const uint8x16_t b2 = vqtbl1q_u8(p.val[2], idx), b3 = vqtbl1q_u8(p.val[3], idx);
    const uint16x8_t l01 = vreinterpretq_u16_u8(vzip1q_u8(b0, b1)), h01 = vreinterpretq_u16_u8(vzip2q_u8(b0, b1));
    const uint16x8_t l23 = vreinterpretq_u16_u8(vzip1q_u8(b2, b3)), h23 = vreinterpretq_u16_u8(vzip2q_u8(b2, b3));
    out[0] = vreinterpretq_f32_u16(vzip1q_u16(l01, l23));
    out[1] = vreinterpretq_f32_u16(vzip2q_u16(l01, l23));
    out[2] = vreinterpretq_f32_u16(vzip1q_u16(h01, h23));
    out[3] = vreinterpretq_f32_u16(vzip2q_u16(h01, h23));
  }
  // The same 16 values stored to dst (ST4 interleaves the planes back into whole values).
  inline void lookup_store(uint8x16_t idx, float* dst) const {
    uint8x16x4_t b;
    for (int j = 0; j < 4; ++j) b.val[j] = vqtbl1q_u8(p.val[j], idx);
    vst4q_u8(reinterpret_cast<uint8_t*>(dst), b);
  }
};

// The same for a 16-entry table of 16-bit values (two planes).
struct Planes16 {
  uint8x16x2_t p;
  explicit Planes16(const uint16_t* tab) : p(vld2q_u8(reinterpret_cast<const uint8_t*>(tab))) {}
  inline void lookup(uint8x16_t idx, uint16x8_t out[2]) const {
    const uint8x16_t lo = vqtbl1q_u8(p.val[0], idx), hi = vqtbl1q_u8(p.val[1], idx);
    out[0] = vreinterpretq_u16_u8(vzip1q_u8(lo, hi));
    out[1] = vreinterpretq_u16_u8(vzip2q_u8(lo, hi));
  }
  inline void lookup_store(uint8x16_t idx, uint16_t* dst) const {
    uint8x16x2_t b;
    b.val[0] = vqtbl1q_u8(p.val[0], idx);
    b.val[1] = vqtbl1q_u8(p.val[1], idx);
    vst2q_u8(reinterpret_cast<uint8_t*>(dst), b);
  }
};

// The 32 codes of 16 packed bytes in element order (first of each pair in the high nibble).
inline uint8x16x2_t unpack_nibbles(uint8x16_t bytes) {
  const uint8x16_t hi = vshrq_n_u8(bytes, 4), lo = vandq_u8(bytes, vdupq_n_u8(15));
  return {{vzip1q_u8(hi, lo), vzip2q_u8(hi, lo)}};
}

// 16 codes (each < 16, element order) packed two per byte, the first in the high nibble.
inline uint8x8_t pack_nibbles(uint8x16_t codes) {
  const uint16x8_t w = vreinterpretq_u16_u8(codes);  // lane i: codes[2i] | codes[2i + 1] << 8
  return vmovn_u16(vorrq_u16(vshlq_n_u16(w, 4), vshrq_n_u16(w, 8)));
}

// Largest 32-bit / 16-bit lane.
inline uint32_t max_u32(uint32x4_t v) { return vmaxvq_u32(v); }
inline uint32_t max_u16(uint16x8_t v) { return vmaxvq_u16(v); }

}  // namespace neon_simd
}  // namespace BNB_ISA_NS
}  // namespace bnb
