# Defines the `torch` target from a torch installation's CPU libraries alone. Used instead of
# find_package(Torch) when torch is a CUDA build but nothing here is compiled for CUDA: torch's own
# TorchConfig.cmake then insists on finding a CUDA toolkit, which the machine may not have.
#   XK_TORCH_ROOT        the torch package folder (python -c 'import torch, os; print(os.path.dirname(torch.__file__))')
#   XK_TORCH_CXX11_ABI   0 or 1 (torch.compiled_with_cxx11_abi())
if(NOT TARGET torch)
  if(NOT XK_TORCH_ROOT)
    message(FATAL_ERROR "XK_TORCH_ROOT must name the torch package folder")
  endif()
  foreach(lib torch torch_cpu c10)
    find_library(XK_TORCH_LIB_${lib} ${lib} PATHS "${XK_TORCH_ROOT}/lib" NO_DEFAULT_PATH REQUIRED)
    list(APPEND XK_TORCH_LIBS "${XK_TORCH_LIB_${lib}}")
  endforeach()
  add_library(torch INTERFACE IMPORTED)
  set_target_properties(torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${XK_TORCH_ROOT}/include;${XK_TORCH_ROOT}/include/torch/csrc/api/include"
    INTERFACE_LINK_LIBRARIES "${XK_TORCH_LIBS}"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${XK_TORCH_CXX11_ABI}")
  set(TORCH_INSTALL_PREFIX "${XK_TORCH_ROOT}")
endif()
