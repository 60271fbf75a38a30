# cmake -DSOURCE_DIR=DIR -DFILES="A|B|..." -DOUTPUT=HEADER -P gpu_module_abi.cmake
#
# Writes HEADER, the interface fingerprint of bottle's GPU modules (src/backend/gpu_module.h):
# a hash of the contents of FILES (paths under DIR), the headers that an executable and a
# module both compile against. A module and an executable built from different versions of
# them may disagree on a layout or a function, so the loader refuses the pair instead of
# calling through it. Touched only when the text changes, so that nothing else recompiles.
string(REPLACE "|" ";" files "${FILES}")
list(SORT files)
set(all "")
foreach(file IN LISTS files)
  file(SHA256 "${file}" digest)
  file(RELATIVE_PATH name "${SOURCE_DIR}" "${file}")
  string(APPEND all "${name} ${digest}\n")
endforeach()
string(SHA256 hash "${all}")
string(SUBSTRING "${hash}" 0 16 hash)
set(text "#pragma once\n// The GPU modules' interface fingerprint (cmake/gpu_module_abi.cmake).\n")
string(APPEND text "#define BOTTLE_GPU_MODULE_ABI \"${hash}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
