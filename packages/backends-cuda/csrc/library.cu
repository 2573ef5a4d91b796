// The library's own entry points, next to the generated bnb_cuda_<kernel> launchers: versions, the
// architectures compiled in, and a probe telling whether the current device can run this library's code.
// A failed call clears the runtime's last-error state: the generated launchers return cudaGetLastError(),
// and the next launch must not report this call's failure as its own.
#include <cuda_runtime.h>

#include "launcher.h"

#ifndef BNB_CUDA_ARCHS_STRING
#error "BNB_CUDA_ARCHS_STRING must be defined by the build (CMakeLists.txt)"
#endif

__global__ void bnb_cuda_probe() {}

extern "C" {

BNB_EXPORT const char* bnb_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

BNB_EXPORT int bnb_cuda_runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) return v;
  (void)cudaGetLastError();
  return -1;
}

// 0 when no driver is installed; works even when the driver is too old for this runtime.
BNB_EXPORT int bnb_cuda_driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) return v;
  (void)cudaGetLastError();
  return -1;
}

BNB_EXPORT const char* bnb_cuda_archs() { return BNB_CUDA_ARCHS_STRING; }

// cudaErrorNoKernelImageForDevice when the current device has neither SASS nor loadable PTX here;
// cudaErrorInsufficientDriver when the driver is older than the runtime linked in.
BNB_EXPORT int bnb_cuda_check_device() {
  cudaFuncAttributes attr;
  const cudaError_t e = cudaFuncGetAttributes(&attr, bnb_cuda_probe);
  if (e != cudaSuccess) (void)cudaGetLastError();
  return static_cast<int>(e);
}

}  // extern "C"
