// Runs a program of the build (train_gpt, train_cnn, ...) as a user would, for the end-to-end tests: its exit
// code and everything it printed.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace minidl::testing {

struct ProgramResult {
  int code;         // the exit status, -1 if it did not exit normally
  std::string out;  // stdout and stderr together
};

// Runs `command` through the shell with stderr folded into stdout.
inline ProgramResult run_program(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  ProgramResult r{-1, ""};
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace minidl::testing
