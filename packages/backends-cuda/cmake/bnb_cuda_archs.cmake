# Which of the requested GPU architectures an nvcc version can compile, and the CMake architecture list
# built from them: SASS for each, PTX for the lowest (any newer GPU can JIT it) and for the highest (the
# best code for GPUs newer than the list).
#
# Included by CMakeLists.txt. Also runs alone, so that a test can ask about any CUDA version:
#   cmake -DBNB_NVCC_VERSION=12.4 -DBNB_REQUESTED="75;80;100;120" -P cmake/bnb_cuda_archs.cmake
# prints "kept=...", "dropped=...", "cmake=..." and "described=..." lines.

# arch:first CUDA version that compiles it[:first version that no longer does]. From NVIDIA's CUDA
# release notes: 12.8 added sm_100/101/120, 12.9 sm_103/121; 13.0 renamed sm_101 to sm_110 and removed
# offline compilation for everything before sm_75 (Maxwell, Pascal, Volta); `nvcc --list-gpu-code` of
# 13.0 gives exactly 75 80 86 87 88 89 90 100 103 110 120 121. An arch missing here is passed to nvcc as is.
set(BNB_CUDA_ARCH_SUPPORT
    50:6.0:13.0 52:6.5:13.0 53:7.0:13.0 60:8.0:13.0 61:8.0:13.0 62:8.0:13.0 70:9.0:13.0 72:10.0:13.0
    75:10.0 80:11.0 86:11.1 87:11.4 88:13.0 89:11.8 90:11.8 100:12.8 101:12.8:13.0 103:12.9 110:13.0
    120:12.8 121:12.9)

# bnb_cuda_filter_archs(<nvcc version> <requested list> <kept var> <dropped var>): requested archs
# ("80", "90a", ...) split by whether that nvcc compiles them; each dropped entry reads "sm_XY (CUDA A-B)".
function(bnb_cuda_filter_archs version requested kept_var dropped_var)
  set(kept)
  set(dropped)
  foreach(arch IN LISTS requested)
    string(REGEX MATCH "^[0-9]+" number "${arch}")
    set(ok TRUE)
    foreach(entry IN LISTS BNB_CUDA_ARCH_SUPPORT)
      string(REPLACE ":" ";" fields "${entry}")
      list(GET fields 0 known)
      if(known STREQUAL number)
        list(GET fields 1 since)
        set(why "CUDA >= ${since}")
        if(version VERSION_LESS since)
          set(ok FALSE)
        endif()
        list(LENGTH fields n)
        if(n GREATER 2)
          list(GET fields 2 until)
          set(why "CUDA ${since} to < ${until}")
          if(version VERSION_GREATER_EQUAL until)
            set(ok FALSE)
          endif()
        endif()
      endif()
    endforeach()
    if(ok)
      list(APPEND kept "${arch}")
    else()
      list(APPEND dropped "sm_${arch} (${why})")
    endif()
  endforeach()
  set(${kept_var} "${kept}" PARENT_SCOPE)
  set(${dropped_var} "${dropped}" PARENT_SCOPE)
endfunction()

# bnb_cuda_arch_list(<archs> <cmake var> <described var>): CMAKE_CUDA_ARCHITECTURES entries (XY-real, or
# XY for SASS and PTX) for sorted `archs`, PTX for the lowest and the highest, and the text the library
# reports (bnb_cuda_archs()): "sm_75 sm_80 ... compute_75 compute_120 (PTX)".
function(bnb_cuda_arch_list archs list_var described_var)
  list(SORT archs COMPARE NATURAL)
  list(GET archs 0 lowest)
  list(GET archs -1 highest)
  set(out)
  set(sass)
  foreach(arch IN LISTS archs)
    if(arch STREQUAL lowest OR arch STREQUAL highest)
      list(APPEND out "${arch}")
    else()
      list(APPEND out "${arch}-real")
    endif()
    string(APPEND sass "sm_${arch} ")
  endforeach()
  if(lowest STREQUAL highest)
    set(ptx "compute_${lowest}")
  else()
    set(ptx "compute_${lowest} compute_${highest}")
  endif()
  set(${list_var} "${out}" PARENT_SCOPE)
  set(${described_var} "${sass}${ptx} (PTX)" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  bnb_cuda_filter_archs("${BNB_NVCC_VERSION}" "${BNB_REQUESTED}" kept dropped)
  message("kept=${kept}")
  message("dropped=${dropped}")
  if(kept)
    bnb_cuda_arch_list("${kept}" arch_list described)
    message("cmake=${arch_list}")
    message("described=${described}")
  endif()
endif()
