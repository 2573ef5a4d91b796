// <cooperative_groups.h> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cooperative_groups.h> (cooperative groups) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
