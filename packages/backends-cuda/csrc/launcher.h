// Declarations shared by the hand-written library entry points and the generated launchers.
#pragma once

#include <cuda_runtime.h>

#if defined(_WIN32)
#define BNB_EXPORT __declspec(dllexport)
#else
#define BNB_EXPORT __attribute__((visibility("default")))
#endif

// Every launcher returns a cudaError_t as int: 0 on success, else the launch error (never sticky
// errors of earlier launches of other libraries: this library links its own static runtime).

#ifdef BNB_EMU
// In the kernel emulator (tests) a launcher runs its kernel to completion on the calling thread, with
// host memory for device memory. There are no streams; the last one a launcher was handed is kept, so
// that a test can see the C entry points pass their caller's stream on.
typedef struct CUstream_st* cudaStream_t;
inline void* bnb_cuda_emu_last_stream = nullptr;
// Defined here: an emulated build is one translation unit.
extern "C" BNB_EXPORT void* bnb_cuda_emu_stream_seen() { return bnb_cuda_emu_last_stream; }
#endif
