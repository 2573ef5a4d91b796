// <cooperative_groups/reduce.h> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cooperative_groups/reduce.h> (cooperative groups) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
