// The library's own entry points, next to the generated bnb_cuda_<kernel> launchers: versions, the
// architectures compiled in, and a probe telling whether the current device can run this library's code.
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
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : -1;
}

// 0 when no driver is installed; works even when the driver is too old for this runtime.
BNB_EXPORT int bnb_cuda_driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : -1;
}

BNB_EXPORT const char* bnb_cuda_archs() { return BNB_CUDA_ARCHS_STRING; }

// cudaErrorNoKernelImageForDevice when the current device has neither SASS nor loadable PTX here;
// cudaErrorInsufficientDriver when the driver is older than the runtime linked in.
BNB_EXPORT int bnb_cuda_check_device() {
  cudaFuncAttributes attr;
  return static_cast<int>(cudaFuncGetAttributes(&attr, bnb_cuda_probe));
}

}  // extern "C"
