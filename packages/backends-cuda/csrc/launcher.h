// Declarations shared by the hand-written library entry points and the generated launchers.
#pragma once

#include <cuda_runtime.h>

#if defined(_WIN32)
#define BNB_EXPORT __declspec(dllexport)
#else
#define BNB_EXPORT __attribute__((visibility("default")))
#endif

// Every launcher returns a cudaError_t as int: 0 on success, else the launch error. This library links
// its own static runtime, whose last-error state other libraries' (torch's) failures never reach; the
// launchers clear it before launching and every entry point clears it after a failure it reports, so
// no error is reported twice. A sticky error (a kernel fault that corrupts the context) still shows in
// every runtime instance, ours included: the context is unusable then.

#ifdef BNB_EMU
// In the kernel emulator (tests) a launcher runs its kernel to completion on the calling thread, with
// host memory for device memory. There are no streams; the last one a launcher was handed is kept, so
// that a test can see the C entry points pass their caller's stream on.
typedef struct CUstream_st* cudaStream_t;
inline void* bnb_cuda_emu_last_stream = nullptr;
// Defined here: an emulated build is one translation unit.
extern "C" BNB_EXPORT void* bnb_cuda_emu_stream_seen() { return bnb_cuda_emu_last_stream; }
// Leaves `code` in the runtime's last-error state, as a failed call of this library (a probe, a prefetch)
// would on hardware; and reads the state without clearing it.
extern "C" BNB_EXPORT void bnb_cuda_emu_leave_error(int code) {
  ::bnb_emu::cuda::last_runtime_error = static_cast<cudaError_t>(code);
}
extern "C" BNB_EXPORT int bnb_cuda_emu_peek_error() { return static_cast<int>(cudaPeekAtLastError()); }
#endif
