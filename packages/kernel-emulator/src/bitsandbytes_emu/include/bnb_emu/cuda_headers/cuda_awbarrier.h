// <cuda_awbarrier.h> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cuda_awbarrier.h> (asynchronous barriers) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
