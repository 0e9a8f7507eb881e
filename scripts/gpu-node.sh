#!/usr/bin/env bash
# The one command a GPU node runs, from a copy of the source tree that carries the bundle (docs/cuda.md, "The first
# call"):
#
#   bash scripts/gpu-node.sh build-bundle/minidl-gpu.tar.xz "$OUT"                 # the whole check
#   bash scripts/gpu-node.sh build-bundle/minidl-gpu.tar.xz "$OUT" --only kernels  # a second call: gpu-run.sh flags
#
# Unpacks the bundle into a fresh temporary folder (tar with xz; where xz is missing, Python's tarfile, which reads
# xz itself), then runs its gpu-run.sh --require-gpu into OUTDIR with the flags given. When the bundle's programs do
# not load on this system, gpu-run.sh says so within seconds (the probe's and the load step's lines); build on the
# node instead with scripts/gpu-build-there.sh, in a call of its own.
#
# Exit status: gpu-run.sh's (0 PASS, 1 FAIL, 3 NO GPU, 4 BROKEN ENVIRONMENT, 5 CUT OFF); 2 on bad usage or a
# bundle that cannot be unpacked.
set -uo pipefail

if (( $# < 2 )) || [[ $1 == -h || $1 == --help ]]; then
  sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  [[ ${1:-} == -h || ${1:-} == --help ]] && exit 0
  exit 2
fi
bundle_tar="$1" outdir="$2"
shift 2
[[ -f $bundle_tar ]] || { echo "gpu-node: no bundle at '$bundle_tar' (make it with scripts/gpu-bundle.sh and carry it)" >&2; exit 2; }
unpack="$(mktemp -d)"
if command -v xz >/dev/null 2>&1; then
  tar -C "$unpack" -xJf "$bundle_tar" || { echo "gpu-node: tar could not unpack $bundle_tar" >&2; exit 2; }
else
  py=""
  for c in /opt/*/.venv/bin/python3 python3 /usr/bin/python3; do
    if [[ -x $c ]] || command -v "$c" >/dev/null 2>&1; then py="$c"; break; fi
  done
  [[ -n $py ]] || { echo "gpu-node: neither xz nor a Python is here to unpack $bundle_tar" >&2; exit 2; }
  echo "gpu-node: no xz here; unpacking with $py's tarfile"
  "$py" -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t:
    t.extractall(sys.argv[2])' "$bundle_tar" "$unpack" ||
    { echo "gpu-node: Python's tarfile could not unpack $bundle_tar" >&2; exit 2; }
fi
exec bash "$unpack/minidl-gpu/scripts/gpu-run.sh" --require-gpu "$@" "$outdir"
