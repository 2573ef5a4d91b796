// Dispatch geometry, bounds, 16-bit floats, vectors (emulator self-test kernels).
#include <metal_stdlib>
using namespace metal;

// Records each thread's position attributes at its grid position (2-D dispatch with tails).
kernel void positions_2d(device uint4* out [[buffer(0)]],
                         uint2 pos [[thread_position_in_grid]],
                         uint2 grid [[threads_per_grid]],
                         uint2 tg [[threadgroup_position_in_grid]],
                         uint2 tpt [[threads_per_threadgroup]],
                         uint2 dtpt [[dispatch_threads_per_threadgroup]],
                         uint2 local [[thread_position_in_threadgroup]]) {
  out[pos.y * grid.x + pos.x] = uint4(tg.x * dtpt.x + local.x, tg.y * dtpt.y + local.y, tpt.x, tpt.y);
}

kernel void copy_all(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                     uint gid [[thread_position_in_grid]]) {
  y[gid] = x[gid];
}

// Reads one element past the input's end (the launch has more threads than elements).
kernel void read_past_end(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                          uint gid [[thread_position_in_grid]]) {
  y[gid] = x[gid + 1];
}

// Writes one element past the output's end.
kernel void write_past_end(device const float* x [[buffer(0)]], device float* y [[buffer(1)]],
                           uint gid [[thread_position_in_grid]]) {
  y[gid + 1] = x[gid];
}

// float -> half / bfloat -> float round trips, and half arithmetic rounded per operation.
kernel void sixteen_bit(device const float* x [[buffer(0)]],
                        device half* h [[buffer(1)]],
                        device bfloat* b [[buffer(2)]],
                        device half* prod [[buffer(3)]],
                        device float* back [[buffer(4)]],
                        uint gid [[thread_position_in_grid]]) {
  const half hv = half(x[gid]);
  const bfloat bv = bfloat(x[gid]);
  h[gid] = hv;
  b[gid] = bv;
  prod[gid] = hv * hv + 1.5h;
  back[gid] = float(hv) + float(bv);
}

// Vectors: swizzles, component access, as_type, packing bytes.
kernel void vectors(device const float4* x [[buffer(0)]],
                    device float4* swz [[buffer(1)]],
                    device uint* bits [[buffer(2)]],
                    device uchar4* bytes [[buffer(3)]],
                    device float* dots [[buffer(4)]],
                    uint gid [[thread_position_in_grid]]) {
  float4 v = x[gid];
  float4 w = v.wzyx;
  w.xy = v.zz + 1.0;
  w.a *= 2.0f;
  swz[gid] = w;
  bits[gid] = as_type<uint>(v.x);
  bytes[gid] = uchar4(uint4(clamp(v, float4(0.0f), float4(255.0f))));
  dots[gid] = dot(v.xyz, float3(1.0f, 2.0f, 3.0f)) + length(float2(3.0f, 4.0f));
}

// A half scalar parameter (torch passes arg_casts="fp16" values as 2-byte buffers).
kernel void scale_half(device half* x [[buffer(0)]], constant half& s [[buffer(1)]],
                       uint gid [[thread_position_in_grid]]) {
  x[gid] = x[gid] * s;
}

// Template kernel instantiated under host names, as MSL libraries usually are.
template <typename T>
kernel void add_one(device T* x [[buffer(0)]], uint gid [[thread_position_in_grid]]) {
  x[gid] = x[gid] + T(1);
}
template [[host_name("add_one_float")]] kernel void add_one<float>(device float* x [[buffer(0)]],
                                                                   uint gid [[thread_position_in_grid]]);
template [[host_name("add_one_int")]] kernel void add_one<int>(device int* x [[buffer(0)]],
                                                               uint gid [[thread_position_in_grid]]);
