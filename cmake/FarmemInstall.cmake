# Install rules and packaging of farmem as a library, included by CMakeLists.txt after the layer
# libraries are defined. `cmake --install build --prefix P` installs:
#   P/include/farmem/*.h                     the public API
#   P/lib*/libfarmem_*.a                     the static libraries behind it (client and embedded server)
#   P/lib*/cmake/farmem/farmem{Config,ConfigVersion,Targets*}.cmake   find_package(farmem) -> farmem::farmem
#   P/lib*/pkgconfig/farmem.pc               pkg-config --cflags --libs farmem
#   P/bin/farmem, P/bin/farmemd
# Also defines the ctest `public_headers_self_contained` (label lint). See docs/library.md.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(PROJECT_VERSION)
  set(FARMEM_VERSION ${PROJECT_VERSION})
else()
  set(FARMEM_VERSION 0.1.0)
endif()

# The libraries of the public API, each before the ones it depends on (the link order of
# farmem.pc). The server half (service, pools, objects engine/service, server) is there so a
# program can embed a MemoryServer like `farmem demo` does; farmem_bench (hiredis) is not.
# farmem_cluster (the control plane, include/farmem/cluster.h) brings libcurl (its etcd backend);
# the tier engine (farmemd's tiered region) brings liburing; the regions file system
# (include/farmem/regionfs.h) brings libfuse3.
set(FARMEM_INSTALLED_LIBS
    farmem_regions_fs
    farmem_regions_mmap
    farmem_regions_engine
    farmem_regions_format
    farmem_regions_sync
    farmem_regions_rmalloc
    farmem_server
    farmem_cluster
    farmem_objects_service
    farmem_tier_service
    farmem_tx_service
    farmem_tx_engine
    farmem_tx_format
    farmem_pools
    farmem_service
    farmem_objects_engine
    farmem_tier_engine
    farmem_objects_client
    farmem_tier_client
    farmem_tx_client
    farmem_objects_format
    farmem_channels
    farmem_tier_format
    farmem_node
    farmem_transport
    farmem_transport_fabric
    farmem_transport_tcp
    farmem_common)

# nlohmann_json and CLI11 are header-only and used only inside the libraries (the public headers
# name neither; public_headers_self_contained checks that). farmem_layer() links them PUBLIC so
# that the layers above, the CLI and the tests see them: keep that in the build tree, but leave
# them out of the installed interface, so a program using farmem needs neither.
foreach(lib ${FARMEM_INSTALLED_LIBS})
  get_target_property(iface ${lib} INTERFACE_LINK_LIBRARIES)
  if(iface)
    list(TRANSFORM iface REPLACE "^(nlohmann_json::nlohmann_json|CLI11::CLI11)$"
                                 "$<BUILD_INTERFACE:\\1>")
    set_target_properties(${lib} PROPERTIES INTERFACE_LINK_LIBRARIES "${iface}")
  endif()
endforeach()

# farmem::farmem: everything above in one target (the name `farmem` is the CLI binary's, hence
# the EXPORT_NAME). It also asks for C++20, which the public headers need (coroutines, span).
# The include directory comes with the libraries ($<INSTALL_INTERFACE:include> in farmem_layer).
add_library(farmem_all INTERFACE)
set_target_properties(farmem_all PROPERTIES EXPORT_NAME farmem)
target_link_libraries(farmem_all INTERFACE ${FARMEM_INSTALLED_LIBS})
target_compile_features(farmem_all INTERFACE cxx_std_20)
add_library(farmem::farmem ALIAS farmem_all)

set(FARMEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/farmem)
install(TARGETS ${FARMEM_INSTALLED_LIBS} farmem_all
        EXPORT farmemTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/farmem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
# The binaries are defined after the libraries: install them once the whole file has been read.
cmake_language(DEFER CALL install TARGETS farmem farmemd RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT farmemTargets NAMESPACE farmem:: DESTINATION ${FARMEM_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/farmemConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/farmemConfig.cmake
                              INSTALL_DESTINATION ${FARMEM_CMAKE_DIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/farmemConfigVersion.cmake
                                 VERSION ${FARMEM_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/farmemConfig.cmake
              ${PROJECT_BINARY_DIR}/farmemConfigVersion.cmake
        DESTINATION ${FARMEM_CMAKE_DIR})

# farmem.pc, relocatable: the prefix is found from the .pc file's own place, so
# `cmake --install --prefix P` works whatever CMAKE_INSTALL_PREFIX was at configure time.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  message(FATAL_ERROR "farmem.pc needs a relative CMAKE_INSTALL_LIBDIR")
endif()
file(RELATIVE_PATH FARMEM_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" FARMEM_PC_TO_PREFIX "${FARMEM_PC_TO_PREFIX}")
set(FARMEM_PC_LIBS "")
foreach(lib ${FARMEM_INSTALLED_LIBS})
  string(APPEND FARMEM_PC_LIBS " -l${lib}")
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/farmem.pc.in ${PROJECT_BINARY_DIR}/farmem.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/farmem.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Every public header compiles on its own with only include/ on the path and pulls in nothing
# but farmem's own headers and the C++/C standard library (no nlohmann, fmt, spdlog, CLI11,
# libfabric, ...): the contract of the installed API.
enable_testing()
add_test(NAME public_headers_self_contained
         COMMAND ${CMAKE_COMMAND} -DCXX=${CMAKE_CXX_COMPILER}
                 -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
                 -DWORK_DIR=${PROJECT_BINARY_DIR}/public_headers_check
                 -P ${CMAKE_CURRENT_LIST_DIR}/CheckPublicHeaders.cmake)
set_tests_properties(public_headers_self_contained PROPERTIES LABELS lint TIMEOUT 120)
