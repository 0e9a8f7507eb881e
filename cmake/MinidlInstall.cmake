# Install rules: `cmake --install build --prefix P` puts minidl's libraries, headers, CMake package and data under P,
# and another project then uses it with find_package(minidl CONFIG) (examples/consumer/, docs/library.md).
#
#   P/lib/libminidl.a, libminidl_train.a, ...     the static libraries
#   P/include/minidl/core/tensor.h, ...            the headers, in the source tree's layout: #include "core/tensor.h"
#   P/lib/cmake/minidl/minidlConfig.cmake, ...     the package: targets, version, how to find their dependencies
#   P/share/minidl/gpt2.tiktoken, ...              the run-time data (minidl_DATA_DIR in the consumer)
#
# Exported targets (namespace minidl::):
#   minidl::minidl        tensors, autograd, nn, optim, data, dist (CPU); MPI, OpenMP, OpenBLAS, Highway, PCRE2
#   minidl::train         the training layer (minidl_train); no device runtime: a GPU program adds minidl::device
#   minidl::device        the program's CUDA backend, as the build chose it: the emulated one
#                         (-DMINIDL_CUDA_EMULATION=ON), the real one (CUDA built) or nothing (CPU-only)
#   minidl::cuda_backend  the real CUDA backend, when this build has one (the libraries below it come along)
#   minidl::cuda_backend_emu  the emulated one, only when minidl::device is it: otherwise the emulator is a test tool
# Every path in the package is relative to the package's own folder, so the prefix can be moved.

include(CMakePackageConfigHelpers)
set(MINIDL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/minidl)
set(MINIDL_INSTALL_DATADIR ${CMAKE_INSTALL_DATADIR}/minidl)

# What minidl::device links decides which backend goes out; the libraries each backend links go with it.
set(MINIDL_EXPORTED_TARGETS minidl minidl_train minidl_device)
set(MINIDL_EXPORT_CUDA OFF)
set(MINIDL_EXPORT_CUDA_EMU OFF)
if(TARGET minidl_cuda_backend)
  set(MINIDL_EXPORT_CUDA ON)
  list(APPEND MINIDL_EXPORTED_TARGETS minidl_cuda_backend minidl_cuda_backend_archive minidl_cuda_kernels)
  if(TARGET minidl_dist_cuda_kernels)
    list(APPEND MINIDL_EXPORTED_TARGETS minidl_dist_cuda_kernels)
  endif()
endif()
if(MINIDL_CUDA_EMULATION)
  set(MINIDL_EXPORT_CUDA_EMU ON)
  list(APPEND MINIDL_EXPORTED_TARGETS minidl_cuda_backend_emu minidl_cuda_backend_emu_archive minidl_cuda_kernels_emu
       minidl_cuda_emu minidl_dist_cuda_kernels_emu minidl_nccl_emu)
endif()
# Which optional CUDA libraries the real backend links, for the package to find again.
set(MINIDL_EXPORT_CUDNN OFF)
set(MINIDL_EXPORT_NCCL OFF)
if(MINIDL_EXPORT_CUDA AND CUDNN_FOUND)
  set(MINIDL_EXPORT_CUDNN ON)
endif()
if(MINIDL_EXPORT_CUDA AND NCCL_FOUND)
  set(MINIDL_EXPORT_NCCL ON)
endif()

# minidl::<name without the minidl_ prefix>; minidl itself is minidl::minidl.
foreach(target ${MINIDL_EXPORTED_TARGETS})
  string(REGEX REPLACE "^minidl_" "" export_name ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${export_name})
endforeach()
install(TARGETS ${MINIDL_EXPORTED_TARGETS} EXPORT minidlTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT minidlTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR})

# `cmake --build build --target minidl_libraries` builds what the install needs, not the programs and tests.
add_custom_target(minidl_libraries)
add_dependencies(minidl_libraries ${MINIDL_EXPORTED_TARGETS})

# The headers of every exported layer (cuda_emu's too: ops/cuda's headers include cuda_emu/cuda_compat.h, which
# picks the real CUDA headers under nvcc).
foreach(layer core ops autograd nn optim data dist train cuda_emu)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minidl/${layer}
          FILES_MATCHING PATTERN "*.h")
endforeach()

# The run-time data: GPT-2's encoding (train::TrainConfig::gpt2_encoding, data::Tokenizer::gpt2) and the corpus.
install(FILES ${PROJECT_SOURCE_DIR}/data/gpt2.tiktoken ${PROJECT_SOURCE_DIR}/data/gpt2.tiktoken.LICENSE
              ${PROJECT_SOURCE_DIR}/data/tinyshakespeare.txt
        DESTINATION ${MINIDL_INSTALL_DATADIR})

# The package: its config (which finds the dependencies again), the version (SameMajorVersion: 0.x consumers take
# any 0.y, a 1.0 would not do for them) and the find modules it needs from cmake/.
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/minidlConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/minidlConfig.cmake
                              INSTALL_DESTINATION ${MINIDL_INSTALL_CMAKEDIR}
                              PATH_VARS MINIDL_INSTALL_DATADIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/minidlConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/minidlConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/minidlConfigVersion.cmake
              ${CMAKE_CURRENT_LIST_DIR}/MinidlBlas.cmake ${CMAKE_CURRENT_LIST_DIR}/FindCUDNN.cmake
              ${CMAKE_CURRENT_LIST_DIR}/FindNCCL.cmake
        DESTINATION ${MINIDL_INSTALL_CMAKEDIR})
