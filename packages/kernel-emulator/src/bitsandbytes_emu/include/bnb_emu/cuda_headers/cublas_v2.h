// <cublas_v2.h> is outside the emulated CUDA subset.
#error "bnb_emu: <cublas_v2.h> (cuBLAS) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
