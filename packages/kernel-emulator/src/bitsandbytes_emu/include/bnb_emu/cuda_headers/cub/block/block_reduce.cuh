// <cub/block/block_reduce.cuh> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cub/block/block_reduce.cuh> (CUB) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
