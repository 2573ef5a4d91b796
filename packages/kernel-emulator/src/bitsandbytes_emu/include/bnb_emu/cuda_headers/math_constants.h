// Stand-in for <math_constants.h> in emulation (the CUDART_* constants kernels commonly use).
#pragma once
#include "bnb_emu/cuda.h"
#define CUDART_INF_F __int_as_float(0x7f800000)
#define CUDART_NAN_F __int_as_float(0x7fffffff)
#define CUDART_PI_F 3.141592654f
#define CUDART_ZERO_F 0.0f
#define CUDART_ONE_F 1.0f
#define CUDART_INF __longlong_as_double(0x7ff0000000000000LL)
#define CUDART_NAN __longlong_as_double(0xfff8000000000000LL)
