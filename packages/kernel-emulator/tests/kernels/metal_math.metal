// metal:: functions against torch (emulator self-test kernels).
#include <metal_stdlib>
using namespace metal;

// Row k of out (each n long) holds function k of x (and y) for every element.
kernel void float_functions(device const float* x [[buffer(0)]],
                            device const float* y [[buffer(1)]],
                            device float* out [[buffer(2)]],
                            constant uint& n [[buffer(3)]],
                            uint i [[thread_position_in_grid]]) {
  const float a = x[i], b = y[i];
  out[0 * n + i] = sqrt(fabs(a));
  out[1 * n + i] = metal::precise::sqrt(fabs(b));
  out[2 * n + i] = round(a);
  out[3 * n + i] = rint(a);
  out[4 * n + i] = floor(a) + ceil(b) + trunc(a);
  out[5 * n + i] = max(a, b) - min(a, b);
  out[6 * n + i] = fmax(a, NAN) + fmin(NAN, b);
  out[7 * n + i] = clamp(a, -1.0, 1.0);
  out[8 * n + i] = select(a, b, a < b);
  out[9 * n + i] = fast::exp(a * 0.1);
  out[10 * n + i] = copysign(2.0f, b) + sign(a);
  out[11 * n + i] = fract(a);
}

// fma rounds once: (1 + 2^-13)^2 - (1 + 2^-12) is 2^-26, which a separate multiply and add lose.
kernel void fused(device float* out [[buffer(0)]]) {
  const float a = 1.0f + 0x1p-13f, c = -(1.0f + 0x1p-12f);
  out[0] = fma(a, a, c);
  out[1] = a * a + c;
}

kernel void integer_functions(device const uint* x [[buffer(0)]], device uint* out [[buffer(1)]],
                              uint i [[thread_position_in_grid]]) {
  const uint v = x[i];
  out[4 * i + 0] = popcount(v);
  out[4 * i + 1] = clz(v);
  out[4 * i + 2] = ctz(v);
  out[4 * i + 3] = mulhi(v, 0x9e3779b9u);
}

// Vectors through functions, selects and as_type.
kernel void vector_functions(device const half4* h [[buffer(0)]], device float4* out [[buffer(1)]],
                             device uint* bits [[buffer(2)]], uint i [[thread_position_in_grid]]) {
  const half4 v = h[i];
  const float4 f = float4(abs(v));
  out[i] = select(f, float4(-1.0f), f > 2.0f);
  bits[i] = as_type<uint>(v.xy);
}
