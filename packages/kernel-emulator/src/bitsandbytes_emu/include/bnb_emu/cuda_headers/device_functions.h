// Stand-in for <device_functions.h> in emulation: everything the emulated subset offers comes from bnb_emu/cuda.h.
#pragma once
#include "bnb_emu/cuda.h"
