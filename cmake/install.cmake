# cmake --install: the public headers, libringtrain.a, a CMake package (find_package(ringtrain)
# gives ringtrain::ringtrain, its dependencies found through find_dependency) and ringtrain.pc.
#
# What the installed target carries, and why: the compile definitions and the architecture
# flags the library was built with (ringtrain::arch: -fno-math-errno, and -march=native when
# RINGTRAIN_NATIVE is on). They are not a preference: Eigen's code is inlined from the installed
# headers into the program as well, and Eigen's alignment and allocation functions differ with
# the vector width (-march=native on an AVX-512 machine: 64-byte alignment, 16 without), so a
# program compiled for another width than the library can free memory that the library
# allocated with another layout. A package built with RINGTRAIN_NATIVE=ON therefore only runs
# on CPUs like the build machine's, as the library itself does; build with
# -DRINGTRAIN_NATIVE=OFF for a portable one. The warnings (ringtrain_warnings) stay ours: they
# are linked as BUILD_INTERFACE only.
include(CMakePackageConfigHelpers)

set(RINGTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ringtrain)

# Headers that include CUDA's, cuDNN's or NCCL's own: installed with the GPU path only.
set(RINGTRAIN_GPU_ONLY_HEADERS cuda_check.h nccl_comm.h staged_ring.h)
file(GLOB RINGTRAIN_PUBLIC_HEADERS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/include/ringtrain/*.h)
if(NOT RINGTRAIN_GPU)
  foreach(header ${RINGTRAIN_GPU_ONLY_HEADERS})
    list(REMOVE_ITEM RINGTRAIN_PUBLIC_HEADERS ${PROJECT_SOURCE_DIR}/include/ringtrain/${header})
  endforeach()
endif()
install(FILES ${RINGTRAIN_PUBLIC_HEADERS} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/ringtrain)

set_target_properties(ringtrain_arch PROPERTIES EXPORT_NAME arch)
install(TARGETS ringtrain ringtrain_arch EXPORT ringtrainTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT ringtrainTargets NAMESPACE ringtrain:: DESTINATION ${RINGTRAIN_CMAKE_DIR})

# The config file needs to know which optional dependencies this build linked.
set(RINGTRAIN_PACKAGE_OPENMP ${OpenMP_CXX_FOUND})
set(RINGTRAIN_PACKAGE_GPU ${RINGTRAIN_GPU})
set(RINGTRAIN_PACKAGE_ONNX ${RINGTRAIN_HAVE_ONNX})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ringtrainConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ringtrainConfig.cmake
                              INSTALL_DESTINATION ${RINGTRAIN_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringtrainConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringtrainConfig.cmake
              ${PROJECT_BINARY_DIR}/ringtrainConfigVersion.cmake
        DESTINATION ${RINGTRAIN_CMAKE_DIR})

# ---- ringtrain.pc: the same flags for builds without CMake ----
# Eigen, spdlog (with fmt) and zlib have .pc files of their own (Requires); MPI's flags come
# from FindMPI, which knows every MPI, rather than from one implementation's .pc name.
set(pc_cflags "-DEIGEN_STACK_ALLOCATION_LIMIT=4194304 -fno-math-errno")
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  string(APPEND pc_cflags " -DEIGEN_NO_DEBUG")
endif()
if(RINGTRAIN_NATIVE)
  string(APPEND pc_cflags " -march=native")
endif()
set(pc_libs "")
# Appends each of the remaining arguments to the string variable `var`, a space before each.
function(pc_append var)
  foreach(item ${ARGN})
    string(APPEND ${var} " ${item}")
  endforeach()
  set(${var} "${${var}}" PARENT_SCOPE)
endfunction()
list(TRANSFORM MPI_CXX_INCLUDE_DIRS PREPEND "-I" OUTPUT_VARIABLE pc_mpi_includes)
pc_append(pc_cflags ${MPI_CXX_COMPILE_OPTIONS} ${pc_mpi_includes})
pc_append(pc_libs ${MPI_CXX_LINK_FLAGS} ${MPI_CXX_LIBRARIES})
if(OpenMP_CXX_FOUND)
  string(APPEND pc_cflags " ${OpenMP_CXX_FLAGS}")
  string(APPEND pc_libs " ${OpenMP_CXX_FLAGS}")
endif()
# The ONNX exporter in the static library needs ONNX's two libraries and protobuf's.
if(RINGTRAIN_HAVE_ONNX)
  string(APPEND pc_libs " -lonnx -lonnx_proto")
  set(pc_requires_onnx ", protobuf")
endif()
if(RINGTRAIN_GPU)
  string(APPEND pc_cflags " -DRINGTRAIN_HAVE_GPU=1")
  set(pc_gpu_includes ${CUDAToolkit_INCLUDE_DIRS} ${RINGTRAIN_CUDNN_INCLUDE} ${RINGTRAIN_NCCL_INCLUDE})
  list(REMOVE_DUPLICATES pc_gpu_includes)
  list(TRANSFORM pc_gpu_includes PREPEND "-I")
  pc_append(pc_cflags ${pc_gpu_includes})
  string(APPEND pc_libs " ${CUDA_cudart_LIBRARY} ${RINGTRAIN_CUDNN_LIBRARY}"
         " ${RINGTRAIN_NCCL_LIBRARY} -l${CMAKE_DL_LIBS}")
endif()
# The prefix is found from the .pc file's own place, so `cmake --install --prefix P` (which does
# not reconfigure) yields a file that is right for P.
file(RELATIVE_PATH pc_prefix_from_pcfiledir /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
string(REGEX REPLACE "/$" "" pc_prefix_from_pcfiledir "${pc_prefix_from_pcfiledir}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/ringtrain.pc.in ${PROJECT_BINARY_DIR}/ringtrain.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ringtrain.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
