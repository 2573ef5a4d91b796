// Binding-side helpers: typed views of the DLPack arrays that torch tensors arrive as.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <stdexcept>
#include <string>

#include "common.h"

namespace bnb {

namespace nb = nanobind;
// No layout constraint in the type: nanobind would otherwise silently copy a strided array, and a
// kernel writing into that copy would lose its output. Contiguity is checked instead (contiguous()).
using Array = nb::ndarray<nb::device::cpu>;

inline int64_t numel(const Array& a) {
  int64_t n = 1;
  for (size_t i = 0; i < a.ndim(); ++i) n *= int64_t(a.shape(i));
  return n;
}

// Throws unless `a` is C-contiguous (size-1 dimensions may have any stride).
inline void contiguous(const Array& a, const char* name) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return;  // an empty array has no layout to get wrong
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected)
      throw std::invalid_argument(std::string(name) + " must be contiguous");
    expected *= int64_t(a.shape(i));
  }
}

inline std::string dtype_name(const Array& a) {
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  auto d = a.dtype();
  return std::string(d.code < 7 ? codes[d.code] : "?") + std::to_string(d.bits);
}

// The floating dtype of `a` (float32, float16 or bfloat16), or a ValueError naming `name`.
inline DType float_dtype(const Array& a, const char* name) {
  contiguous(a, name);
  auto d = a.dtype();
  if (d.lanes == 1) {
    if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 32) return DType::f32;
    if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 16) return DType::f16;
    if (d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) && d.bits == 16) return DType::bf16;
  }
  throw std::invalid_argument(std::string(name) + " must be float32, float16 or bfloat16; got " + dtype_name(a));
}

// `a`'s data as T*, after checking its element type and element count (C++ re-checks what the
// Python glue validated, so a wrong call can never read or write out of bounds).
template <class T>
T* data(Array& a, const char* name, nb::dlpack::dtype_code code, int64_t expected_numel) {
  contiguous(a, name);
  auto d = a.dtype();
  if (d.code != uint8_t(code) || d.bits != sizeof(T) * 8 || d.lanes != 1)
    throw std::invalid_argument(std::string(name) + ": unexpected element type " + dtype_name(a));
  if (expected_numel >= 0 && numel(a) != expected_numel)
    throw std::invalid_argument(std::string(name) + " must have " + std::to_string(expected_numel) + " elements; got " +
                                std::to_string(numel(a)));
  return static_cast<T*>(a.data());
}

inline float* f32(Array& a, const char* name, int64_t n = -1) {
  return data<float>(a, name, nb::dlpack::dtype_code::Float, n);
}
inline uint8_t* u8(Array& a, const char* name, int64_t n = -1) {
  return data<uint8_t>(a, name, nb::dlpack::dtype_code::UInt, n);
}
inline int8_t* i8(Array& a, const char* name, int64_t n = -1) {
  return data<int8_t>(a, name, nb::dlpack::dtype_code::Int, n);
}
inline int32_t* i32(Array& a, const char* name, int64_t n = -1) {
  return data<int32_t>(a, name, nb::dlpack::dtype_code::Int, n);
}

// Raw bytes of a floating array whose dtype the kernel takes as a DType argument.
inline void* float_data(Array& a, const char* name, DType expected, int64_t n = -1) {
  if (float_dtype(a, name) != expected) throw std::invalid_argument(std::string(name) + ": dtype mismatch");
  if (n >= 0 && numel(a) != n)
    throw std::invalid_argument(std::string(name) + " must have " + std::to_string(n) + " elements; got " +
                                std::to_string(numel(a)));
  return a.data();
}

inline int64_t n_blocks(int64_t n, int64_t blocksize) { return (n + blocksize - 1) / blocksize; }

inline void check_blocksize(int64_t blocksize) {
  if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1)))
    throw std::invalid_argument("blocksize must be a power of two in [32, 4096]; got " + std::to_string(blocksize));
}

}  // namespace bnb
