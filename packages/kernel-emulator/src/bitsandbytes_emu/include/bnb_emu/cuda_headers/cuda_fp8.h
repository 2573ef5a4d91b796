// <cuda_fp8.h> is outside the emulated CUDA subset.
#error "bnb_emu: <cuda_fp8.h> (FP8 types) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
