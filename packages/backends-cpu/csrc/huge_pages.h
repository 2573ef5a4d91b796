// Binding-side hint for large outputs that a kernel is about to write.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace bnb {

// torch's CPU allocator maps fresh pages for every large tensor, and the kernel's first writes then
// fault them in 4 KiB at a time: for a dequantize into a new tensor that costs several times the
// kernel itself. Asking for transparent huge pages on the 2 MiB-aligned interior (what torch does
// with THP_MEM_ALLOC_ENABLE=1) cuts the faults 512-fold. Only a hint: it changes no data, errors are
// ignored, and memory that is already mapped is unaffected. Small buffers are left alone.
inline void prefer_huge_pages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  if (bytes < 4 * kHuge) return;
  uintptr_t begin = (uintptr_t(p) + kHuge - 1) & ~(kHuge - 1), end = (uintptr_t(p) + bytes) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace bnb
