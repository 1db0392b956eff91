# Installs public headers, and only those (design section 1).
#
#   spillway_install_public_headers(<header>...)
#
# installs each <header> (a path from the repository root, e.g.
# hooks/torch/spillway_torch.h) and every header it includes with a quoted
# repository path (#include "hooks/..."), transitively, at
# include/spillway/<path>, so the installed headers' own includes resolve
# against the include path spillway::spillway gives (include/spillway). What
# no public header includes (allocator/chunk/, tracer/, hooks/torch/bridge.h)
# stays in the build tree; tests/install checks that it does. A change to a
# scanned header re-runs the configure step, so the list follows its includes.

function(spillway_install_public_headers)
  set(pending ${ARGN})
  set(found "")
  while(pending)
    list(POP_FRONT pending header)
    if(header IN_LIST found)
      continue()
    endif()
    set(path "${PROJECT_SOURCE_DIR}/${header}")
    if(NOT EXISTS "${path}")
      message(FATAL_ERROR "spillway: public header ${header} (or a header it includes) does not exist")
    endif()
    list(APPEND found "${header}")
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${path}")
    file(STRINGS "${path}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" included "${line}")
      list(APPEND pending "${included}")
    endforeach()
  endwhile()
  foreach(header IN LISTS found)
    get_filename_component(folder "${header}" DIRECTORY)
    install(FILES "${PROJECT_SOURCE_DIR}/${header}" DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/spillway/${folder}")
  endforeach()
endfunction()
