// <cub/block/block_store.cuh> is outside the emulated CUDA subset.
#error \
    "bnb_emu: <cub/block/block_store.cuh> (CUB) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
