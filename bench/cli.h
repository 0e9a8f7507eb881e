// Command-line parsing shared by the single-process benchmark programs: a bad flag is a usage error, said on stderr
// with the program's name and exit code 2, as the examples do; --help prints and exits 0.
//
//   if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_cpu_ops")) return *code;
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <optional>

namespace minidl::bench {

// A count flag's accepted values, 1 to 2^30 ("Value 0 not in range 1 to 1073741824").
inline const CLI::Range kPositiveCount{int64_t(1), int64_t(1) << 30};

// nullopt: parsed, go on; otherwise the code to exit with.
inline std::optional<int> parse_flags(CLI::App& app, int argc, char** argv, const char* program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) { return app.exit(e); } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program, e.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace minidl::bench
