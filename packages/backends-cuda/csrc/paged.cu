// Managed (unified) memory for the paged optimizers: the entry points bitsandbytes_cuda/paged.py calls with
// ctypes. Each returns a cudaError_t (0: success); bnb_cuda_error_string turns it into words.
#include <cuda_runtime.h>

#include <cstddef>

#include "launcher.h"

extern "C" {

// A managed allocation of `bytes` (> 0) visible to every device and the host; *out receives it.
BNB_EXPORT int bnb_cuda_managed_alloc(void** out, size_t bytes) {
  *out = nullptr;
  return static_cast<int>(cudaMallocManaged(out, bytes, cudaMemAttachGlobal));
}

BNB_EXPORT int bnb_cuda_managed_free(void* ptr) { return static_cast<int>(cudaFree(ptr)); }

// Start migrating the pages of [ptr, ptr + bytes) to `device` (-1: the host) in stream order.
BNB_EXPORT int bnb_cuda_managed_prefetch(const void* ptr, size_t bytes, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#if CUDART_VERSION >= 13000
  cudaMemLocation where{};
  where.type = device < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  where.id = device < 0 ? 0 : device;
  return static_cast<int>(cudaMemPrefetchAsync(ptr, bytes, where, 0, s));
#else
  return static_cast<int>(cudaMemPrefetchAsync(ptr, bytes, device < 0 ? cudaCpuDeviceId : device, s));
#endif
}

}  // extern "C"
