// <cub/cub.cuh> is outside the emulated CUDA subset.
#error "bnb_emu: <cub/cub.cuh> (CUB) is outside the emulated CUDA subset; see the list in docs/pages/emulator.md"
