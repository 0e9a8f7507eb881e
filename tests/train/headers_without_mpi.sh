#!/bin/sh
# Every header of train/ compiles on its own without MPI's include path (a one-process program of one's own needs
# no MPI compiler wrapper: dist/mpi_fwd.h). Usage: headers_without_mpi.sh CXX SOURCE_DIR
set -eu
cxx="$1" src="$2"
status=0
for h in "$src"/train/*.h; do
  name="train/$(basename "$h")"
  if ! echo "#include \"$name\"" | "$cxx" -std=c++20 -I"$src" -x c++ -fsyntax-only - 2>/tmp/headers_without_mpi.$$; then
    echo "$name does not compile without MPI's include path:"
    head -5 /tmp/headers_without_mpi.$$
    status=1
  fi
done
rm -f /tmp/headers_without_mpi.$$
[ $status -eq 0 ] && echo "every header of train/ compiles without MPI's include path"
exit $status
