# Runs tools/at_scale.sh --quick --check and checks its table on its own:
# the rows it promises are there, and in each the simulated step (ms) is at
# least the bound (ms), as printed.
#   cmake -DSCRIPT=tools/at_scale.sh -DSIM=path/to/spillway-sim -P check_at_scale.cmake
execute_process(COMMAND ${SCRIPT} --quick --check --sim ${SIM}
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT status EQUAL 0)
  message(FATAL_ERROR "at_scale.sh exited with ${status}")
endif()
set(rows 0)
string(REPLACE "\n" ";" lines "${out}")
foreach(line IN LISTS lines)
  # | model | L x d | params | data | compute | h2d / d2h | bound ms | by | sim ms | ratio |
  if(line MATCHES "^\\| ([0-9]+B) \\| [0-9]+ x [0-9]+ \\|[^|]*\\|[^|]*\\|[^|]*\\|[^|]*\\| ([0-9.]+) \\| (copy|room|compute) \\| ([0-9.]+) \\| ([0-9.]+) \\|$")
    set(name ${CMAKE_MATCH_1})
    set(bound ${CMAKE_MATCH_2})
    set(simulated ${CMAKE_MATCH_4})
    if(simulated LESS bound)
      message(FATAL_ERROR "${name}: simulated ${simulated} ms is below the bound ${bound} ms")
    endif()
    list(APPEND names ${name})
    math(EXPR rows "${rows} + 1")
  endif()
endforeach()
if(NOT names STREQUAL "1B;13B")
  message(FATAL_ERROR "expected rows 1B and 13B, got '${names}'")
endif()
if(NOT out MATCHES "\\| 13B \\|[^\n]*\\| (copy|room) \\|")
  message(FATAL_ERROR "the 13B row should be bound by its copies (copy or room)")
endif()
