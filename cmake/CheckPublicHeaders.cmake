# ctest public_headers_self_contained: compiles every include/farmem/*.h alone (C++20, warnings as
# errors, only INCLUDE_DIR on the include path) and fails if one does not compile or pulls in a
# header other than farmem's own and the C++/C standard library's (nlohmann, fmt, spdlog, CLI11,
# libfabric, ...). Run: cmake -DCXX=c++ -DINCLUDE_DIR=include -DWORK_DIR=/tmp/x -P CheckPublicHeaders.cmake
foreach(v CXX INCLUDE_DIR WORK_DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "CheckPublicHeaders.cmake needs -D${v}=...")
  endif()
endforeach()
get_filename_component(INCLUDE_DIR ${INCLUDE_DIR} REALPATH)
file(MAKE_DIRECTORY ${WORK_DIR})
file(GLOB headers ${INCLUDE_DIR}/farmem/*.h)
if(NOT headers)
  message(FATAL_ERROR "no headers in ${INCLUDE_DIR}/farmem")
endif()

# Standard library locations: libstdc++/libc++ (any .../c++/... directory, the compiler's own
# include directory) and the C library's headers (top-level /usr/include/*.h and the
# bits/sys/gnu/linux/asm folders it uses). Third-party headers live in folders of their own.
set(std_re "(/c\\+\\+/|^/usr/lib/gcc/|^/usr/lib/llvm-[^/]+/lib/clang/|^/usr/include/[^/]+\\.h$|^/usr/include/([^/]+-linux-gnu[^/]*/)?(bits|sys|gnu|linux|asm|asm-generic)/)")

set(failed "")
foreach(h ${headers})
  get_filename_component(name ${h} NAME)
  # A source file that includes only this header, as a program using farmem would.
  set(src ${WORK_DIR}/${name}.cc)
  set(dep ${WORK_DIR}/${name}.d)
  file(WRITE ${src} "#include \"farmem/${name}\"\n")
  execute_process(
    COMMAND ${CXX} -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I ${INCLUDE_DIR} -MD -MF ${dep}
            ${src}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message("FAIL ${name}: does not compile on its own\n${out}${err}")
    list(APPEND failed ${name})
    continue()
  endif()
  file(READ ${dep} deps)
  string(REGEX REPLACE "\\\\\n" " " deps "${deps}")
  string(REGEX REPLACE "^[^:]*:" "" deps "${deps}")
  string(REGEX REPLACE "[ \t\n]+" ";" deps "${deps}")
  set(bad "")
  foreach(d ${deps})
    if(d STREQUAL "" OR d STREQUAL src)
      continue()
    endif()
    get_filename_component(real ${d} REALPATH)
    string(FIND "${real}" "${INCLUDE_DIR}/farmem/" own)
    if(own EQUAL 0 OR real MATCHES "${std_re}")
      continue()
    endif()
    list(APPEND bad ${real})
  endforeach()
  if(bad)
    list(JOIN bad "\n  " bad_text)
    message("FAIL ${name}: includes headers outside farmem and the standard library:\n  ${bad_text}")
    list(APPEND failed ${name})
  else()
    message("ok   ${name}")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "public headers not self-contained: ${failed}")
endif()
