# Whether Apple's offline Metal compiler can build bitsandbytes.metallib on this machine.
#
# `metal` and `metallib` are not in the Command Line Tools (only in full Xcode), and from Xcode 26 on they
# are a separate download (the Metal Toolchain): without it `xcrun -f metal` still names a shim, which
# fails when run. So each tool is looked up *and* run (`--version`), through the same
# `xcrun -sdk macosx TOOL` the build uses.
#
# bnb_probe_metal_tools(<xcrun> <ok-var> <why-var> <hint-var>)
#   <ok-var>   TRUE when both tools run;
#   <why-var>  else what is missing, with the tool's own message;
#   <hint-var> else how to get the tools.

set(BNB_METAL_TOOLCHAIN_HINT
    "with Xcode 26 or later, download the Metal Toolchain: `xcodebuild -downloadComponent MetalToolchain`")
set(BNB_FULL_XCODE_HINT
    "install full Xcode (the Command Line Tools have no `metal`) and select it: `sudo xcode-select -s /Applications/Xcode.app`; ${BNB_METAL_TOOLCHAIN_HINT}")

function(bnb_probe_metal_tools xcrun ok_var why_var hint_var)
  set(${ok_var} FALSE PARENT_SCOPE)
  set(${hint_var} "${BNB_FULL_XCODE_HINT}" PARENT_SCOPE)
  if(NOT xcrun)
    set(${why_var} "no `xcrun` on PATH (it comes with Xcode or the Command Line Tools)" PARENT_SCOPE)
    return()
  endif()
  foreach(tool IN ITEMS metal metallib)
    execute_process(
      COMMAND "${xcrun}" -sdk macosx -f ${tool}
      RESULT_VARIABLE rc OUTPUT_VARIABLE found ERROR_VARIABLE err
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0 OR found STREQUAL "")
      set(${why_var} "`xcrun -sdk macosx -f ${tool}` finds no `${tool}` (exit ${rc}: ${err})" PARENT_SCOPE)
      return()
    endif()
    execute_process(
      COMMAND "${xcrun}" -sdk macosx ${tool} --version
      RESULT_VARIABLE rc OUTPUT_VARIABLE version ERROR_VARIABLE err
      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      set(why "`${tool}` is there (${found}) but does not run: `xcrun -sdk macosx ${tool} --version` exited ${rc}: ${err}")
      set(${why_var} "${why}" PARENT_SCOPE)
      if(err MATCHES "Metal Toolchain")
        set(${hint_var} "${BNB_METAL_TOOLCHAIN_HINT}" PARENT_SCOPE)
      endif()
      return()
    endif()
    string(REGEX REPLACE "\n.*" "" version "${version}")
    message(STATUS "bitsandbytes-mps: ${tool}: ${found} (${version})")
  endforeach()
  set(${ok_var} TRUE PARENT_SCOPE)
endfunction()

# AUTO (build the metallib when the tools run, else warn), ON (required), OFF (never): the value of
# BNB_MPS_METALLIB, CMake booleans accepted for ON and OFF.
function(bnb_metallib_mode value out_var)
  string(TOUPPER "${value}" upper)
  if(upper STREQUAL "AUTO" OR upper STREQUAL "")
    set(${out_var} AUTO PARENT_SCOPE)
  elseif(upper MATCHES "^(ON|TRUE|YES|Y|1|REQUIRED)$")
    set(${out_var} ON PARENT_SCOPE)
  elseif(upper MATCHES "^(OFF|FALSE|NO|N|0)$")
    set(${out_var} OFF PARENT_SCOPE)
  else()
    message(FATAL_ERROR "BNB_MPS_METALLIB is '${value}'; expected AUTO, ON or OFF")
  endif()
endfunction()
