# Some toolchains (g++ 13.3 on the H200 machines) link libstdc++ statically into every shared
# library by default. torch uses the process's shared libstdc++, and torch's inline code compiled
# into libxkernels (TORCH_CHECK's message stream) then mixes the two copies' locale state: formatting
# a number in an error message crashed the process or cut the message short.
#
# xk_use_process_libstdcxx(target): link the compiler's shared libstdc++ by its full path, ahead of
# the compiler's own libraries, so every std:: symbol resolves to the copy torch uses and a static
# libstdc++.a has nothing left to contribute. Where the toolchain has no shared libstdc++, the static
# copy is kept private (--exclude-libs,ALL): neither exported to nor interposed by the process's one.
# XKERNELS_LIBSTDCXX=private forces the second way (CI builds both).
set(XKERNELS_LIBSTDCXX "auto" CACHE STRING "libstdc++ linking: auto (shared where the compiler has it) or private")
set_property(CACHE XKERNELS_LIBSTDCXX PROPERTY STRINGS auto private)

function(xk_use_process_libstdcxx target)
  target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU" OR XKERNELS_LIBSTDCXX STREQUAL "private")
    message(STATUS "xkernels: libstdc++ as the compiler links it, any static copy kept private")
    return()
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
                  OUTPUT_VARIABLE libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(IS_ABSOLUTE "${libstdcxx}" AND EXISTS "${libstdcxx}")
    target_link_libraries(${target} PRIVATE "${libstdcxx}")
    message(STATUS "xkernels: linking the shared libstdc++ (${libstdcxx})")
  else()
    message(STATUS "xkernels: the compiler has no shared libstdc++; any static copy kept private")
  endif()
endfunction()
