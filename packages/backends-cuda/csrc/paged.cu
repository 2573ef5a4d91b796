// Managed (unified) memory for the paged optimizers: the entry points bitsandbytes_cuda/paged.py calls with
// ctypes. Each returns a cudaError_t (0: success); bnb_cuda_error_string turns it into words. A failed call
// clears the runtime's last-error state, so that the next kernel launch does not report it as its own.
#include <cuda_runtime.h>

#include <cstddef>

#include "launcher.h"

namespace {

int handled(cudaError_t e) {
  if (e != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(e);
}

}  // namespace

extern "C" {

// A managed allocation of `bytes` (> 0) visible to every device and the host; *out receives it.
BNB_EXPORT int bnb_cuda_managed_alloc(void** out, size_t bytes) {
  *out = nullptr;
  return handled(cudaMallocManaged(out, bytes, cudaMemAttachGlobal));
}

BNB_EXPORT int bnb_cuda_managed_free(void* ptr) { return handled(cudaFree(ptr)); }

// *out = cudaDevAttrConcurrentManagedAccess of `device`: 0 where the GPU cannot migrate managed pages on
// demand (Windows/WDDM, WSL2, some Jetsons); there cudaMemPrefetchAsync fails, so the caller skips it.
BNB_EXPORT int bnb_cuda_concurrent_managed_access(int device, int* out) {
  *out = 0;
  return handled(cudaDeviceGetAttribute(out, cudaDevAttrConcurrentManagedAccess, device));
}

// Start migrating the pages of [ptr, ptr + bytes) to `device` (-1: the host) in stream order. Both the
// target device and the stream's device need concurrent managed access (the caller checks).
BNB_EXPORT int bnb_cuda_managed_prefetch(const void* ptr, size_t bytes, int device, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#if CUDART_VERSION >= 13000
  cudaMemLocation where{};
  where.type = device < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  where.id = device < 0 ? 0 : device;
  return handled(cudaMemPrefetchAsync(ptr, bytes, where, 0, s));
#else
  return handled(cudaMemPrefetchAsync(ptr, bytes, device < 0 ? cudaCpuDeviceId : device, s));
#endif
}

}  // extern "C"
