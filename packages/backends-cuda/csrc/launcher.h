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
