// <mma.h> is outside the emulated CUDA subset.
#error "bnb_emu: <mma.h> (tensor-core WMMA) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
