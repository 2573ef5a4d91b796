// <curand_kernel.h> is outside the emulated CUDA subset.
#error "bnb_emu: <curand_kernel.h> (cuRAND) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
