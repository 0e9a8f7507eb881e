#!/usr/bin/env bash
# Installs missing dependencies, builds, and runs the test suite, from any working directory.
#
#   scripts/test.sh                     # everything
#   scripts/test.sh -R Tensor           # extra arguments go to ctest (here: only tests matching "Tensor")
#
# Exit status is ctest's. MINIDL_BUILD_DIR selects the build tree (default: build), as in scripts/build.sh.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MINIDL_BUILD_DIR:-build}"

"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"
cd "$root"
exec ctest --test-dir "$build_dir" --output-on-failure -j2 "$@"
