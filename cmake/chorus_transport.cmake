# SPDX-License-Identifier: Apache-2.0
# chorus_add_transport(NAME DEPENDS targets...): the INTERFACE target chorus::NAME for
# transports/NAME, with its own include root and every header verified self-contained.
# One helper, so that every transport has the same shape (the layout STYLE.md describes).
function(chorus_add_transport name)
  cmake_parse_arguments(arg "" "" "DEPENDS" ${ARGN})
  set(dir ${CMAKE_CURRENT_SOURCE_DIR}/include)
  add_library(chorus_${name} INTERFACE)
  add_library(chorus::${name} ALIAS chorus_${name})
  target_link_libraries(chorus_${name} INTERFACE ${arg_DEPENDS})
  target_include_directories(chorus_${name} INTERFACE
    $<BUILD_INTERFACE:${dir}> $<INSTALL_INTERFACE:include>)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${dir}/*.hpp)
  target_sources(chorus_${name} INTERFACE FILE_SET HEADERS BASE_DIRS ${dir} FILES ${headers})
  set_target_properties(chorus_${name} PROPERTIES VERIFY_INTERFACE_HEADER_SETS ON)
endfunction()
