// <cuda_pipeline.h> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cuda_pipeline.h> (asynchronous copies) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
