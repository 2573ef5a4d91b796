// CUDA shim: lets the host C++ compiler build a .cu kernel source unchanged and run it on the lane
// scheduler (runtime.h). Force-included (-include bnb_emu/cuda.h) ahead of the kernel source; the
// directory bnb_emu/cuda_headers/ stands in for <cuda_runtime.h>, <cuda_fp16.h>, <cuda_bf16.h>, ... and
// turns headers outside the emulated subset (cub, mma.h, cooperative_groups, ...) into #error.
//
// The subset it implements is listed in docs/pages/emulator.md. Constructs outside it fail to compile
// with a message starting "bnb_emu:", never silently. Values are exact where hardware is exact (half and
// bfloat16 conversions round to nearest even, bit for bit); fast-math intrinsics (__expf, __fdividef,
// rsqrtf, ...) are computed accurately here, so their results may differ from hardware in the last bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

#include "bnb_emu/runtime.h"

#define BNB_EMU 1
#define BNB_EMU_CUDA 1

// ---- qualifiers -------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __constant__
// One block runs at a time, so a static is exactly "one copy per block"; thread_local because every
// launch runs on a fresh host thread, so each launch starts with these zeroed (see runtime.cpp).
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
// __restrict__ is understood by g++ and clang++ as it is.

namespace bnb_emu {
namespace cuda {

// A compile error at the point of use, for constructs outside the subset.
template <class...>
struct always_false : std::false_type {};

}  // namespace cuda
}  // namespace bnb_emu

#define BNB_EMU_UNSUPPORTED(what)                                                     \
  ([]() -> int {                                                                      \
    static_assert(sizeof(char) == 0, "bnb_emu: " what                                 \
                                     " is outside the emulated CUDA subset (see the " \
                                     "list in docs/pages/emulator.md)");              \
    return 0;                                                                         \
  }())

// ---- built-in vector types ---------------------------------------------------------------------------
#define BNB_EMU_VEC1(name, T, al)            \
  struct __attribute__((aligned(al))) name { \
    T x;                                     \
  };                                         \
  inline name make_##name(T x) { return name{x}; }
#define BNB_EMU_VEC2(name, T, al)            \
  struct __attribute__((aligned(al))) name { \
    T x, y;                                  \
  };                                         \
  inline name make_##name(T x, T y) { return name{x, y}; }
#define BNB_EMU_VEC3(name, T) \
  struct name {               \
    T x, y, z;                \
  };                          \
  inline name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define BNB_EMU_VEC4(name, T, al)            \
  struct __attribute__((aligned(al))) name { \
    T x, y, z, w;                            \
  };                                         \
  inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

BNB_EMU_VEC1(char1, signed char, 1)
BNB_EMU_VEC2(char2, signed char, 2)
BNB_EMU_VEC3(char3, signed char)
BNB_EMU_VEC4(char4, signed char, 4)
BNB_EMU_VEC1(uchar1, unsigned char, 1)
BNB_EMU_VEC2(uchar2, unsigned char, 2)
BNB_EMU_VEC3(uchar3, unsigned char)
BNB_EMU_VEC4(uchar4, unsigned char, 4)
BNB_EMU_VEC1(short1, short, 2)
BNB_EMU_VEC2(short2, short, 4)
BNB_EMU_VEC3(short3, short)
BNB_EMU_VEC4(short4, short, 8)
BNB_EMU_VEC1(ushort1, unsigned short, 2)
BNB_EMU_VEC2(ushort2, unsigned short, 4)
BNB_EMU_VEC3(ushort3, unsigned short)
BNB_EMU_VEC4(ushort4, unsigned short, 8)
BNB_EMU_VEC1(int1, int, 4)
BNB_EMU_VEC2(int2, int, 8)
BNB_EMU_VEC3(int3, int)
BNB_EMU_VEC4(int4, int, 16)
BNB_EMU_VEC1(uint1, unsigned int, 4)
BNB_EMU_VEC2(uint2, unsigned int, 8)
BNB_EMU_VEC4(uint4, unsigned int, 16)
BNB_EMU_VEC1(longlong1, long long, 8)
BNB_EMU_VEC2(longlong2, long long, 16)
BNB_EMU_VEC1(ulonglong1, unsigned long long, 8)
BNB_EMU_VEC2(ulonglong2, unsigned long long, 16)
BNB_EMU_VEC1(float1, float, 4)
BNB_EMU_VEC2(float2, float, 8)
BNB_EMU_VEC3(float3, float)
BNB_EMU_VEC4(float4, float, 16)
BNB_EMU_VEC1(double1, double, 8)
BNB_EMU_VEC2(double2, double, 16)

struct uint3 {
  unsigned int x, y, z;
};
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ---- thread coordinates ------------------------------------------------------------------------------
namespace bnb_emu {
namespace cuda {
inline uint3 to_uint3(const Dim3& d) { return uint3{d.x, d.y, d.z}; }
inline uint3 thread_idx() { return to_uint3(lane().thread); }
inline uint3 block_idx() { return to_uint3(lane().group); }
inline dim3 block_dim() {
  const Dim3& d = config().block;
  return dim3(d.x, d.y, d.z);
}
inline dim3 grid_dim() {
  const Dim3& d = config().grid;
  return dim3(d.x, d.y, d.z);
}
}  // namespace cuda
}  // namespace bnb_emu

#define threadIdx (::bnb_emu::cuda::thread_idx())
#define blockIdx (::bnb_emu::cuda::block_idx())
#define blockDim (::bnb_emu::cuda::block_dim())
#define gridDim (::bnb_emu::cuda::grid_dim())
#define warpSize 32

// ---- 16-bit floats -----------------------------------------------------------------------------------
namespace bnb_emu {
namespace cuda {

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> binary16, round to nearest even; NaN becomes 0x7fff as in CUDA's conversion.
inline uint16_t float_to_half_rn(float f) {
  const uint32_t x = f2u(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity (>= 65520)
  if (a >= 0x38800000u) {                       // normal in half
    const uint32_t m = a - (112u << 23);
    uint32_t h = m >> 13;
    const uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // |f| <= 2^-25 rounds to zero (the tie goes to even zero)
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// float -> binary16 rounding toward zero.
inline uint16_t float_to_half_rz(float f) {
  const uint32_t x = f2u(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fffu;
  if (a == 0x7f800000u) return sign | 0x7c00u;
  if (a >= 0x47800000u) return sign | 0x7bffu;  // finite values too large saturate to the largest finite
  if (a >= 0x38800000u) return static_cast<uint16_t>(sign | ((a - (112u << 23)) >> 13));
  if (a < 0x33800000u) return sign;
  const uint32_t e = a >> 23;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | (mant >> (126u - e)));
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

// float -> bfloat16, round to nearest even; NaN becomes 0x7fff as in CUDA's conversion.
inline uint16_t float_to_bf16_rn(float f) {
  const uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline uint16_t float_to_bf16_rz(float f) {
  const uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
  return static_cast<uint16_t>(x >> 16);
}
inline float bf16_to_float(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }

struct RawTag {};

}  // namespace cuda
}  // namespace bnb_emu

struct __half_raw {
  unsigned short x;
};
struct __nv_bfloat16_raw {
  unsigned short x;
};

// Arithmetic on these types rounds the exact float result once, like the hardware half/bf16 units
// (a float result of +, -, *, / on 16-bit inputs rounds to the same 16-bit value as the exact result).
struct __half {
  unsigned short __x;
  __half() = default;
  constexpr __half(__half_raw r) : __x(r.x) {}
  __half(float f) : __x(::bnb_emu::cuda::float_to_half_rn(f)) {}
  __half(double f) : __x(::bnb_emu::cuda::float_to_half_rn(static_cast<float>(f))) {}
  __half(int v) : __half(static_cast<float>(v)) {}
  __half(unsigned int v) : __half(static_cast<float>(v)) {}
  __half(long long v) : __half(static_cast<float>(v)) {}
  __half(unsigned long long v) : __half(static_cast<float>(v)) {}
  __half(short v) : __half(static_cast<float>(v)) {}
  __half(unsigned short v) : __half(static_cast<float>(v)) {}
  operator float() const { return ::bnb_emu::cuda::half_to_float(__x); }
  operator __half_raw() const { return __half_raw{__x}; }
};

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  constexpr __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
  __nv_bfloat16(float f) : __x(::bnb_emu::cuda::float_to_bf16_rn(f)) {}
  __nv_bfloat16(double f) : __x(::bnb_emu::cuda::float_to_bf16_rn(static_cast<float>(f))) {}
  __nv_bfloat16(int v) : __nv_bfloat16(static_cast<float>(v)) {}
  __nv_bfloat16(unsigned int v) : __nv_bfloat16(static_cast<float>(v)) {}
  __nv_bfloat16(long long v) : __nv_bfloat16(static_cast<float>(v)) {}
  __nv_bfloat16(unsigned long long v) : __nv_bfloat16(static_cast<float>(v)) {}
  __nv_bfloat16(short v) : __nv_bfloat16(static_cast<float>(v)) {}
  __nv_bfloat16(unsigned short v) : __nv_bfloat16(static_cast<float>(v)) {}
  operator float() const { return ::bnb_emu::cuda::bf16_to_float(__x); }
  operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
using nv_bfloat16 = __nv_bfloat16;
using half = __half;

struct __attribute__((aligned(4))) __half2 {
  __half x, y;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
using half2 = __half2;
using nv_bfloat162 = __nv_bfloat162;

#define BNB_EMU_HALF_OPS(H)                                                                   \
  inline H operator+(H a, H b) { return H(static_cast<float>(a) + static_cast<float>(b)); }   \
  inline H operator-(H a, H b) { return H(static_cast<float>(a) - static_cast<float>(b)); }   \
  inline H operator*(H a, H b) { return H(static_cast<float>(a) * static_cast<float>(b)); }   \
  inline H operator/(H a, H b) { return H(static_cast<float>(a) / static_cast<float>(b)); }   \
  inline H operator-(H a) {                                                                   \
    H r = a;                                                                                  \
    r.__x ^= 0x8000u;                                                                         \
    return r;                                                                                 \
  }                                                                                           \
  inline H operator+(H a) { return a; }                                                       \
  inline H& operator+=(H& a, H b) { return a = a + b; }                                       \
  inline H& operator-=(H& a, H b) { return a = a - b; }                                       \
  inline H& operator*=(H& a, H b) { return a = a * b; }                                       \
  inline H& operator/=(H& a, H b) { return a = a / b; }                                       \
  inline bool operator==(H a, H b) { return static_cast<float>(a) == static_cast<float>(b); } \
  inline bool operator!=(H a, H b) { return static_cast<float>(a) != static_cast<float>(b); } \
  inline bool operator<(H a, H b) { return static_cast<float>(a) < static_cast<float>(b); }   \
  inline bool operator>(H a, H b) { return static_cast<float>(a) > static_cast<float>(b); }   \
  inline bool operator<=(H a, H b) { return static_cast<float>(a) <= static_cast<float>(b); } \
  inline bool operator>=(H a, H b) { return static_cast<float>(a) >= static_cast<float>(b); }
BNB_EMU_HALF_OPS(__half)
BNB_EMU_HALF_OPS(__nv_bfloat16)

namespace bnb_emu {
template <>
struct ScalarCode<__half> {
  static constexpr const char* code = "h";
};
template <>
struct ScalarCode<__nv_bfloat16> {
  static constexpr const char* code = "b";
};
}  // namespace bnb_emu

// Conversions (the names of cuda_fp16.h / cuda_bf16.h).
inline __half __float2half(float f) { return __half_raw{::bnb_emu::cuda::float_to_half_rn(f)}; }
inline __half __float2half_rn(float f) { return __half_raw{::bnb_emu::cuda::float_to_half_rn(f)}; }
inline __half __float2half_rz(float f) { return __half_raw{::bnb_emu::cuda::float_to_half_rz(f)}; }
inline float __half2float(__half h) { return ::bnb_emu::cuda::half_to_float(h.__x); }
inline __half __double2half(double d) { return __float2half_rn(static_cast<float>(d)); }
inline __half __int2half_rn(int v) { return __float2half_rn(static_cast<float>(v)); }
inline __half __uint2half_rn(unsigned v) { return __float2half_rn(static_cast<float>(v)); }
inline int __half2int_rz(__half h) { return static_cast<int>(__half2float(h)); }
inline int __half2int_rn(__half h) { return static_cast<int>(std::nearbyint(__half2float(h))); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return static_cast<short>(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return __half_raw{u}; }
inline __half __short_as_half(short s) { return __half_raw{static_cast<unsigned short>(s)}; }
inline __half2 __float2half2_rn(float f) { return __half2{__float2half_rn(f), __float2half_rn(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half2 __half2half2(__half a) { return __half2{a, a}; }
inline float2 __half22float2(__half2 h) { return float2{__half2float(h.x), __half2float(h.y)}; }
inline __half2 __float22half2_rn(float2 f) { return __half2{__float2half_rn(f.x), __float2half_rn(f.y)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16_raw{::bnb_emu::cuda::float_to_bf16_rn(f)}; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16_raw{::bnb_emu::cuda::float_to_bf16_rn(f)}; }
inline __nv_bfloat16 __float2bfloat16_rz(float f) { return __nv_bfloat16_raw{::bnb_emu::cuda::float_to_bf16_rz(f)}; }
inline float __bfloat162float(__nv_bfloat16 b) { return ::bnb_emu::cuda::bf16_to_float(b.__x); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __float2bfloat16_rn(static_cast<float>(d)); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline short __bfloat16_as_short(__nv_bfloat16 b) { return static_cast<short>(b.__x); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16_raw{u}; }
inline __nv_bfloat16 __short_as_bfloat16(short s) { return __nv_bfloat16_raw{static_cast<unsigned short>(s)}; }
inline __nv_bfloat162 __float2bfloat162_rn(float f) {
  return __nv_bfloat162{__float2bfloat16_rn(f), __float2bfloat16_rn(f)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162{a, b}; }
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __nv_bfloat162{a, a}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{__bfloat162float(h.x), __bfloat162float(h.y)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
  return __nv_bfloat162{__float2bfloat16_rn(f.x), __float2bfloat16_rn(f.y)};
}
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }

// Half / bfloat16 arithmetic intrinsics.
#define BNB_EMU_HALF_FNS(H, P)                                                                  \
  inline H P##add(H a, H b) { return a + b; }                                                   \
  inline H P##sub(H a, H b) { return a - b; }                                                   \
  inline H P##mul(H a, H b) { return a * b; }                                                   \
  inline H P##div(H a, H b) { return a / b; }                                                   \
  inline H P##neg(H a) { return -a; }                                                           \
  inline H P##abs(H a) {                                                                        \
    H r = a;                                                                                    \
    r.__x &= 0x7fffu;                                                                           \
    return r;                                                                                   \
  }                                                                                             \
  inline H P##fma(H a, H b, H c) {                                                              \
    return H(static_cast<float>(std::fma(static_cast<double>(static_cast<float>(a)),            \
                                         static_cast<double>(static_cast<float>(b)),            \
                                         static_cast<double>(static_cast<float>(c)))));         \
  }                                                                                             \
  inline H P##max(H a, H b) { return std::fmax(static_cast<float>(a), static_cast<float>(b)); } \
  inline H P##min(H a, H b) { return std::fmin(static_cast<float>(a), static_cast<float>(b)); } \
  inline bool P##eq(H a, H b) { return a == b; }                                                \
  inline bool P##ne(H a, H b) { return a != b; }                                                \
  inline bool P##lt(H a, H b) { return a < b; }                                                 \
  inline bool P##le(H a, H b) { return a <= b; }                                                \
  inline bool P##gt(H a, H b) { return a > b; }                                                 \
  inline bool P##ge(H a, H b) { return a >= b; }
BNB_EMU_HALF_FNS(__half, __h)
inline __half hsqrt(__half a) { return std::sqrt(static_cast<float>(a)); }
inline __half hexp(__half a) { return std::exp(static_cast<float>(a)); }
inline __half hlog(__half a) { return std::log(static_cast<float>(a)); }
inline __half hrsqrt(__half a) { return 1.0f / std::sqrt(static_cast<float>(a)); }
inline bool __hisnan(__half a) { return std::isnan(static_cast<float>(a)); }
inline bool __hisinf(__half a) { return std::isinf(static_cast<float>(a)) ? 1 : 0; }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{a.x + b.x, a.y + b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{a.x * b.x, a.y * b.y}; }
inline __half2 __hsub2(__half2 a, __half2 b) { return __half2{a.x - b.x, a.y - b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

// bfloat16 intrinsics carry the same names with "__h" (cuda_bf16.h overloads them on the type).
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return a - b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) { return a / b; }
inline __nv_bfloat16 __hneg(__nv_bfloat16 a) { return -a; }
inline __nv_bfloat16 __habs(__nv_bfloat16 a) {
  __nv_bfloat16 r = a;
  r.__x &= 0x7fffu;
  return r;
}
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __nv_bfloat16(static_cast<float>(std::fma(static_cast<double>(static_cast<float>(a)),
                                                   static_cast<double>(static_cast<float>(b)),
                                                   static_cast<double>(static_cast<float>(c)))));
}
inline __nv_bfloat16 __hmax(__nv_bfloat16 a, __nv_bfloat16 b) {
  return std::fmax(static_cast<float>(a), static_cast<float>(b));
}
inline __nv_bfloat16 __hmin(__nv_bfloat16 a, __nv_bfloat16 b) {
  return std::fmin(static_cast<float>(a), static_cast<float>(b));
}
inline __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x + b.x, a.y + b.y}; }
inline __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) { return __nv_bfloat162{a.x * b.x, a.y * b.y}; }

// ---- math intrinsics ---------------------------------------------------------------------------------
// The fast versions are computed accurately: equal to hardware up to its documented error bound.
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float rcbrtf(float a) { return 1.0f / std::cbrt(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __exp10f(float a) { return std::pow(10.0f, a); }
inline float exp10f(float a) { return std::pow(10.0f, a); }
inline float __logf(float a) { return std::log(a); }
inline float __log2f(float a) { return std::log2(a); }
inline float __log10f(float a) { return std::log10(a); }
inline float __sinf(float a) { return std::sin(a); }
inline float __cosf(float a) { return std::cos(a); }
inline float __tanf(float a) { return std::tan(a); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline void __sincosf(float a, float* s, float* c) {
  *s = std::sin(a);
  *c = std::cos(a);
}
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : (a == a ? a : 0.0f)); }
inline float normcdff(float a) { return 0.5f * std::erfc(-a / std::sqrt(2.0f)); }

inline int __float2int_rn(float a) { return static_cast<int>(std::nearbyint(a)); }
inline int __float2int_rz(float a) { return static_cast<int>(a); }
inline int __float2int_rd(float a) { return static_cast<int>(std::floor(a)); }
inline int __float2int_ru(float a) { return static_cast<int>(std::ceil(a)); }
inline unsigned __float2uint_rn(float a) { return static_cast<unsigned>(std::nearbyint(a)); }
inline unsigned __float2uint_rz(float a) { return static_cast<unsigned>(a); }
inline float __int2float_rn(int a) { return static_cast<float>(a); }
inline float __uint2float_rn(unsigned a) { return static_cast<float>(a); }
inline long long __float2ll_rn(float a) { return static_cast<long long>(std::nearbyint(a)); }
inline int __float_as_int(float a) { return static_cast<int>(::bnb_emu::cuda::f2u(a)); }
inline unsigned __float_as_uint(float a) { return ::bnb_emu::cuda::f2u(a); }
inline float __int_as_float(int a) { return ::bnb_emu::cuda::u2f(static_cast<uint32_t>(a)); }
inline float __uint_as_float(unsigned a) { return ::bnb_emu::cuda::u2f(a); }
inline long long __double_as_longlong(double d) {
  long long r;
  std::memcpy(&r, &d, 8);
  return r;
}
inline double __longlong_as_double(long long v) {
  double r;
  std::memcpy(&r, &v, 8);
  return r;
}

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
inline int __clzll(long long v) { return v == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(v)); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline unsigned __brev(unsigned v) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long both = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    unsigned sel = (s >> (4 * i)) & 7u;
    r |= static_cast<unsigned>((both >> (8 * sel)) & 0xffu) << (8 * i);
  }
  return r;
}
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<long long>(a) * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32);
}
inline int __mul24(int a, int b) { return static_cast<int>(static_cast<long long>((a << 8) >> 8) * ((b << 8) >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  const unsigned long long v = (static_cast<unsigned long long>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift & 31u));
}

// CUDA's global min/max overloads.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(int a, unsigned b) { return min(static_cast<unsigned>(a), b); }
inline unsigned max(int a, unsigned b) { return max(static_cast<unsigned>(a), b); }
inline unsigned min(unsigned a, int b) { return min(a, static_cast<unsigned>(b)); }
inline unsigned max(unsigned a, int b) { return max(a, static_cast<unsigned>(b)); }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// Cache-hinted loads and stores are plain memory accesses here.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
template <class T>
inline T __ldca(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) {
  return *p;
}
template <class T>
inline T __ldlu(const T* p) {
  return *p;
}
template <class T>
inline T __ldcv(const T* p) {
  return *p;
}
template <class T>
inline void __stcg(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stcs(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwb(T* p, T v) {
  *p = v;
}
template <class T>
inline void __stwt(T* p, T v) {
  *p = v;
}

// One block runs at a time and lanes switch only at barriers and collectives, so memory is always
// coherent: fences are no-ops (memory-model bugs are not visible in emulation; see the docs).
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline void __nanosleep(unsigned) {}
#define __trap() ::bnb_emu::fail("__trap() called")
#define __brkpt() ::bnb_emu::fail("__brkpt() called")

// ---- atomics -----------------------------------------------------------------------------------------
// Lanes never interleave between a read and a write (no preemption), so a plain read-modify-write is
// atomic. Every function returns the old value, as in CUDA.
namespace bnb_emu {
namespace cuda {
template <class T, class F>
inline T rmw(T* p, F f) {
  T old = *p;
  *p = f(old);
  return old;
}
}  // namespace cuda
}  // namespace bnb_emu

#define BNB_EMU_ATOMIC(name, T, expr)                               \
  inline T name(T* p, T v) {                                        \
    return ::bnb_emu::cuda::rmw(p, [v](T o) -> T { return expr; }); \
  }                                                                 \
  inline T name##_block(T* p, T v) { return name(p, v); }           \
  inline T name##_system(T* p, T v) { return name(p, v); }

BNB_EMU_ATOMIC(atomicAdd, int, o + v)
BNB_EMU_ATOMIC(atomicAdd, unsigned int, o + v)
BNB_EMU_ATOMIC(atomicAdd, unsigned long long, o + v)
BNB_EMU_ATOMIC(atomicAdd, float, o + v)
BNB_EMU_ATOMIC(atomicAdd, double, o + v)
BNB_EMU_ATOMIC(atomicAdd, __half, o + v)
BNB_EMU_ATOMIC(atomicAdd, __nv_bfloat16, o + v)
BNB_EMU_ATOMIC(atomicSub, int, o - v)
BNB_EMU_ATOMIC(atomicSub, unsigned int, o - v)
BNB_EMU_ATOMIC(atomicExch, int, v)
BNB_EMU_ATOMIC(atomicExch, unsigned int, v)
BNB_EMU_ATOMIC(atomicExch, unsigned long long, v)
BNB_EMU_ATOMIC(atomicExch, float, v)
BNB_EMU_ATOMIC(atomicMax, int, o > v ? o : v)
BNB_EMU_ATOMIC(atomicMax, unsigned int, o > v ? o : v)
BNB_EMU_ATOMIC(atomicMax, long long, o > v ? o : v)
BNB_EMU_ATOMIC(atomicMax, unsigned long long, o > v ? o : v)
BNB_EMU_ATOMIC(atomicMin, int, o < v ? o : v)
BNB_EMU_ATOMIC(atomicMin, unsigned int, o < v ? o : v)
BNB_EMU_ATOMIC(atomicMin, long long, o < v ? o : v)
BNB_EMU_ATOMIC(atomicMin, unsigned long long, o < v ? o : v)
BNB_EMU_ATOMIC(atomicAnd, int, o& v)
BNB_EMU_ATOMIC(atomicAnd, unsigned int, o& v)
BNB_EMU_ATOMIC(atomicAnd, unsigned long long, o& v)
BNB_EMU_ATOMIC(atomicOr, int, o | v)
BNB_EMU_ATOMIC(atomicOr, unsigned int, o | v)
BNB_EMU_ATOMIC(atomicOr, unsigned long long, o | v)
BNB_EMU_ATOMIC(atomicXor, int, o ^ v)
BNB_EMU_ATOMIC(atomicXor, unsigned int, o ^ v)
BNB_EMU_ATOMIC(atomicXor, unsigned long long, o ^ v)
BNB_EMU_ATOMIC(atomicInc, unsigned int, o >= v ? 0u : o + 1u)
BNB_EMU_ATOMIC(atomicDec, unsigned int, (o == 0u || o > v) ? v : o - 1u)

#define BNB_EMU_ATOMIC_CAS(T)                                                         \
  inline T atomicCAS(T* p, T compare, T v) {                                          \
    T old = *p;                                                                       \
    if (old == compare) *p = v;                                                       \
    return old;                                                                       \
  }                                                                                   \
  inline T atomicCAS_block(T* p, T compare, T v) { return atomicCAS(p, compare, v); } \
  inline T atomicCAS_system(T* p, T compare, T v) { return atomicCAS(p, compare, v); }
BNB_EMU_ATOMIC_CAS(int)
BNB_EMU_ATOMIC_CAS(unsigned int)
BNB_EMU_ATOMIC_CAS(unsigned long long)
BNB_EMU_ATOMIC_CAS(unsigned short)

// ---- barriers and warp collectives -------------------------------------------------------------------
namespace bnb_emu {
namespace cuda {

// The types __shfl_*_sync accepts in CUDA (cuda_fp16.h / cuda_bf16.h add the 16-bit ones).
template <class T>
struct Shuffleable
    : std::integral_constant<bool, std::is_same<T, int>::value || std::is_same<T, unsigned int>::value ||
                                       std::is_same<T, long>::value || std::is_same<T, unsigned long>::value ||
                                       std::is_same<T, long long>::value ||
                                       std::is_same<T, unsigned long long>::value || std::is_same<T, float>::value ||
                                       std::is_same<T, double>::value || std::is_same<T, __half>::value ||
                                       std::is_same<T, __half2>::value || std::is_same<T, __nv_bfloat16>::value ||
                                       std::is_same<T, __nv_bfloat162>::value> {};

inline void check_width(const char* site, const char* what, int width) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail("%s at %s: width %d is not a power of two in 1..32", what, site, width);
}

// PTX shfl.sync semantics: lanes are grouped into segments of `width`; a source outside the caller's
// segment yields the caller's own value.
enum class ShflMode { Idx, Up, Down, Xor };

template <class T>
inline T shuffle(const char* site, const char* what, ShflMode mode, unsigned mask, T var, int b, int width) {
  static_assert(Shuffleable<T>::value,
                "bnb_emu: __shfl_*_sync takes int, unsigned, long long, float, double, __half(2) or "
                "__nv_bfloat16(2) values, as in CUDA");
  check_width(site, what, width);
  T all[32];
  warp_exchange(site, what, mask, &var, all, sizeof(T));
  const int me = static_cast<int>(lane().lane);
  const int seg = 32 - width;  // the PTX segment mask
  const int min_lane = me & seg;
  const int max_lane = mode == ShflMode::Up ? min_lane : (min_lane | (31 & ~seg));
  int j = 0;
  bool in_range = false;
  switch (mode) {
    case ShflMode::Idx:
      j = min_lane | (b & ~seg & 31);
      in_range = j <= max_lane;
      break;
    case ShflMode::Up:
      j = me - b;
      in_range = j >= max_lane;
      break;
    case ShflMode::Down:
      j = me + b;
      in_range = j <= max_lane;
      break;
    case ShflMode::Xor:
      j = me ^ b;
      in_range = j <= max_lane;
      break;
  }
  if (!in_range) return var;
  if (j < 0 || j > 31 || !(mask >> j & 1u))
    fail("%s at %s: lane %d reads lane %d, which is not in the mask 0x%08x (on hardware: an undefined value)", what,
         site, me, j, mask);
  return all[j];
}

// __syncwarp(mask = full): a functor so the macro can pass the call site and still take 0 or 1 argument.
struct SyncWarp {
  const char* site;
  void operator()(unsigned mask = 0xffffffffu) const {
    unsigned char token = 0, all[32];
    if (mask == 0xffffffffu) mask = warp_mask();  // a short last warp: the lanes that exist
    warp_exchange(site, "__syncwarp", mask, &token, all, 1);
  }
};

inline unsigned full_or(unsigned mask) { return mask == 0xffffffffu ? warp_mask() : mask; }

inline unsigned ballot(const char* site, const char* what, unsigned mask, int pred) {
  unsigned char v = pred ? 1 : 0, all[32];
  warp_exchange(site, what, full_or(mask), &v, all, 1);
  unsigned r = 0;
  for (int i = 0; i < 32; ++i)
    if (all[i]) r |= 1u << i;
  return r & mask;
}

template <class T, class Op>
inline T reduce(const char* site, const char* what, unsigned mask, T v, Op op) {
  T all[32];
  mask = full_or(mask);
  warp_exchange(site, what, mask, &v, all, sizeof(T));
  bool first = true;
  T r{};
  for (int i = 0; i < 32; ++i) {
    if (!(mask >> i & 1u)) continue;
    r = first ? all[i] : op(r, all[i]);
    first = false;
  }
  return r;
}

}  // namespace cuda
}  // namespace bnb_emu

// A full mask in a block whose last warp is short names lanes that do not exist; CUDA lets those
// lanes be absent, so the emulator narrows 0xffffffff to the lanes that exist.
#define __syncthreads() ::bnb_emu::barrier(BNB_EMU_SITE, "__syncthreads")
#define __syncthreads_count(p) \
  static_cast<int>(::bnb_emu::barrier_sum(BNB_EMU_SITE, "__syncthreads_count", (p) ? 1u : 0u))
#define __syncthreads_or(p) \
  static_cast<int>(::bnb_emu::barrier_sum(BNB_EMU_SITE, "__syncthreads_or", (p) ? 1u : 0u) != 0)
#define __syncthreads_and(p) \
  static_cast<int>(::bnb_emu::barrier_sum(BNB_EMU_SITE, "__syncthreads_and", (p) ? 0u : 1u) == 0)
#define __syncwarp(...) ::bnb_emu::cuda::SyncWarp{BNB_EMU_SITE}(__VA_ARGS__)
#define BNB_EMU_SHFL(mode, what, mask, var, b, ...)                                                         \
  ::bnb_emu::cuda::shuffle(BNB_EMU_SITE, what, ::bnb_emu::cuda::ShflMode::mode,                             \
                           ::bnb_emu::cuda::full_or(static_cast<unsigned>(mask)), var, static_cast<int>(b), \
                           ::bnb_emu::cuda::shfl_width(__VA_ARGS__))
namespace bnb_emu {
namespace cuda {
inline int shfl_width(int w = 32) { return w; }
}  // namespace cuda
}  // namespace bnb_emu
#define __shfl_sync(mask, var, src, ...) BNB_EMU_SHFL(Idx, "__shfl_sync", mask, var, src, ##__VA_ARGS__)
#define __shfl_up_sync(mask, var, d, ...) BNB_EMU_SHFL(Up, "__shfl_up_sync", mask, var, d, ##__VA_ARGS__)
#define __shfl_down_sync(mask, var, d, ...) BNB_EMU_SHFL(Down, "__shfl_down_sync", mask, var, d, ##__VA_ARGS__)
#define __shfl_xor_sync(mask, var, m, ...) BNB_EMU_SHFL(Xor, "__shfl_xor_sync", mask, var, m, ##__VA_ARGS__)
#define __ballot_sync(mask, pred) ::bnb_emu::cuda::ballot(BNB_EMU_SITE, "__ballot_sync", mask, pred)
#define __any_sync(mask, pred) (::bnb_emu::cuda::ballot(BNB_EMU_SITE, "__any_sync", mask, pred) != 0u)
#define __all_sync(mask, pred)                                        \
  (::bnb_emu::cuda::ballot(BNB_EMU_SITE, "__all_sync", mask, pred) == \
   (static_cast<unsigned>(mask) & ::bnb_emu::warp_mask()))
#define __reduce_add_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_add_sync", mask, v, [](auto a, auto b) { return a + b; })
#define __reduce_min_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_min_sync", mask, v, [](auto a, auto b) { return a < b ? a : b; })
#define __reduce_max_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_max_sync", mask, v, [](auto a, auto b) { return a > b ? a : b; })
#define __reduce_and_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_and_sync", mask, v, [](auto a, auto b) { return a & b; })
#define __reduce_or_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_or_sync", mask, v, [](auto a, auto b) { return a | b; })
#define __reduce_xor_sync(mask, v) \
  ::bnb_emu::cuda::reduce(BNB_EMU_SITE, "__reduce_xor_sync", mask, v, [](auto a, auto b) { return a ^ b; })

// ---- outside the subset: a compile error that says so --------------------------------------------------
#define __shfl(...) BNB_EMU_UNSUPPORTED("__shfl (without _sync; removed since CUDA 9)")
#define __shfl_up(...) BNB_EMU_UNSUPPORTED("__shfl_up (without _sync; removed since CUDA 9)")
#define __shfl_down(...) BNB_EMU_UNSUPPORTED("__shfl_down (without _sync; removed since CUDA 9)")
#define __shfl_xor(...) BNB_EMU_UNSUPPORTED("__shfl_xor (without _sync; removed since CUDA 9)")
#define __ballot(...) BNB_EMU_UNSUPPORTED("__ballot (without _sync; removed since CUDA 9)")
#define __any(...) BNB_EMU_UNSUPPORTED("__any (without _sync; removed since CUDA 9)")
#define __all(...) BNB_EMU_UNSUPPORTED("__all (without _sync; removed since CUDA 9)")
#define __activemask(...) BNB_EMU_UNSUPPORTED("__activemask (convergence is not modelled)")
#define __match_any_sync(...) BNB_EMU_UNSUPPORTED("__match_any_sync")
#define __match_all_sync(...) BNB_EMU_UNSUPPORTED("__match_all_sync")
#define clock64(...) BNB_EMU_UNSUPPORTED("clock64 (timing)")
#define __globaltimer(...) BNB_EMU_UNSUPPORTED("__globaltimer (timing)")
#define tex1Dfetch(...) BNB_EMU_UNSUPPORTED("texture fetches")
#define tex2D(...) BNB_EMU_UNSUPPORTED("texture fetches")
#define __managed__ BNB_EMU_UNSUPPORTED_managed_memory_is_outside_the_emulated_subset
#define __cvta_generic_to_shared(...) BNB_EMU_UNSUPPORTED("__cvta_generic_to_shared (address spaces)")
#define __pipeline_memcpy_async(...) BNB_EMU_UNSUPPORTED("__pipeline_memcpy_async (cp.async)")
// Inline PTX cannot run on the host.
#define asm BNB_EMU_UNSUPPORTED("inline asm (PTX)");

// ---- the runtime's last-error state ------------------------------------------------------------------
// As the CUDA runtime keeps it per host thread: a failed launch records an error, cudaGetLastError()
// returns the recorded one and resets it, cudaPeekAtLastError() only reads it. Enough for host code that
// clears the state before a launch and reports cudaGetLastError() after it. Codes are the runtime's.
enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorLaunchFailure = 719 };
typedef enum cudaError cudaError_t;

namespace bnb_emu {
namespace cuda {
inline thread_local cudaError_t last_runtime_error = cudaSuccess;
}  // namespace cuda
}  // namespace bnb_emu

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ::bnb_emu::cuda::last_runtime_error;
  ::bnb_emu::cuda::last_runtime_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::bnb_emu::cuda::last_runtime_error; }

// ---- launching ---------------------------------------------------------------------------------------
namespace bnb_emu {
namespace cuda {

inline Dim3 to_dim3(dim3 d) { return Dim3{d.x, d.y, d.z}; }

// kernel<<<grid, block, shmem>>>(args...) for host C++ code: runs the kernel with the arguments as given
// (raw pointers, no guarded copies). Returns 0, or nonzero with bnb_emu::last_error() set (the message)
// and cudaErrorLaunchFailure recorded for cudaGetLastError(), as a failed launch on hardware records one.
template <class... P, class... A>
int launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem, A&&... args) {
  LaunchConfig cfg;
  cfg.kernel = name;
  cfg.grid = to_dim3(grid);
  cfg.block = to_dim3(block);
  cfg.dynamic_shared = shmem;
  cfg.warp_size = 32;
  auto body = [&]() { kernel(static_cast<P>(args)...); };
  const int rc = ::bnb_emu::launch(cfg, body);
  if (rc != 0) last_runtime_error = cudaErrorLaunchFailure;
  return rc;
}

// The C ABI entry behind BNB_EMU_CUDA_EXPORT: grid and block as 3 unsigned each.
template <class F>
int call_exported(const char* name, F kernel, const unsigned* grid, const unsigned* block, unsigned long long shmem,
                  const Arg* args, int nargs) {
  LaunchConfig cfg;
  cfg.kernel = name;
  cfg.grid = Dim3{grid[0], grid[1], grid[2]};
  cfg.block = Dim3{block[0], block[1], block[2]};
  cfg.dynamic_shared = static_cast<size_t>(shmem);
  cfg.warp_size = 32;
  return Signature<F>::run(cfg, args, nargs, kernel);
}

}  // namespace cuda
}  // namespace bnb_emu

#define BNB_EMU_LAUNCH(kernel, grid, block, shmem, ...) \
  ::bnb_emu::cuda::launch(#kernel, kernel, grid, block, shmem, ##__VA_ARGS__)

// Exports kernel `...` (a function name or a template instance) to Python as NAME:
// bnb_emu_signature_NAME() -> parameter codes; bnb_emu_call_NAME(grid[3], block[3], shmem, args, nargs).
#define BNB_EMU_CUDA_EXPORT(NAME, ...)                                                                            \
  BNB_EMU_EXPORT_C const char* bnb_emu_signature_##NAME() {                                                       \
    static char sig[1024];                                                                                        \
    ::bnb_emu::Signature<decltype(&(__VA_ARGS__))>::describe(sig, sizeof sig);                                    \
    return sig;                                                                                                   \
  }                                                                                                               \
  BNB_EMU_EXPORT_C int bnb_emu_call_##NAME(const unsigned* grid, const unsigned* block, unsigned long long shmem, \
                                           const ::bnb_emu::Arg* args, int nargs) {                               \
    return ::bnb_emu::cuda::call_exported(#NAME, &(__VA_ARGS__), grid, block, shmem, args, nargs);                \
  }
