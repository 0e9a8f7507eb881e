# minidl::blas — OpenBLAS built for OpenMP (Debian: libopenblas-openmp-dev), linked by full path so that the
# run-time search path picks this flavour even when the system default (alternatives) is the pthread one.
# Inside an OpenMP parallel region this OpenBLAS runs single-threaded, which is what lets minidl split a batch
# across threads while each thread calls sgemm.
find_library(MINIDL_OPENBLAS_LIBRARY NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp
  NO_DEFAULT_PATH)
find_path(MINIDL_OPENBLAS_INCLUDE_DIR cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
  NO_DEFAULT_PATH)
if(NOT MINIDL_OPENBLAS_LIBRARY OR NOT MINIDL_OPENBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "OpenBLAS (OpenMP flavour) not found: expected libopenblas.so under "
                      "/usr/lib/<arch>/openblas-openmp. Run scripts/install-deps.sh (installs libopenblas-openmp-dev).")
endif()
add_library(minidl::blas UNKNOWN IMPORTED)
set_target_properties(minidl::blas PROPERTIES
  IMPORTED_LOCATION ${MINIDL_OPENBLAS_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${MINIDL_OPENBLAS_INCLUDE_DIR})
get_filename_component(_blas_dir ${MINIDL_OPENBLAS_LIBRARY} DIRECTORY)
set(CMAKE_BUILD_RPATH ${CMAKE_BUILD_RPATH} ${_blas_dir})
set(CMAKE_INSTALL_RPATH ${CMAKE_INSTALL_RPATH} ${_blas_dir})
message(STATUS "minidl: OpenBLAS (OpenMP) ${MINIDL_OPENBLAS_LIBRARY}")
