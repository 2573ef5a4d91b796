// <cub/block/block_scan.cuh> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cub/block/block_scan.cuh> (CUB) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
