// The command-line tools' main(): errors and output failures as exit codes.
//
// Note [A tool fails out loud]
// A tool's error is a line on stderr and a non-zero exit, never an abort.
// An exception its body lets escape (an invalid argument deep in a library,
// a thread the system cannot start) is printed as "TOOL: what" with exit 1,
// where std::terminate would abort with a core dump. Output that could not
// all be written (a full disk, a closed pipe) is an error too: a tool that
// printed half its report must not exit 0.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>

namespace spillway {

template <typename Body>
int run_tool(const char* tool, Body body) {
  int status = 0;
  try {
    status = body();
  } catch (const std::exception& error) {
    std::cout.flush();
    std::fflush(stdout);
    std::fprintf(stderr, "%s: %s\n", tool, error.what());
    return 1;
  }
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "%s: writing the output failed: %s\n", tool, std::strerror(errno));
    return status == 0 ? 1 : status;
  }
  return status;
}

}  // namespace spillway
