#!/usr/bin/env bash
# The GPU check's dry run (CI's gpu_bundle stage): a bundle from scripts/gpu-bundle.sh, unpacked in a fresh folder
# and run by its own scripts/gpu-run.sh in a clean environment (env -i: no PATH, no LD_LIBRARY_PATH, no build tree),
# on a machine without a GPU. Where this user may make a mount namespace (root, unshare), Open MPI's install
# folders, its daemon (orted, mpirun) and OpenBLAS's folder are hidden too, as on a GPU node that has none of them:
# the programs must run from the bundle's own libraries, and a world of one must start without mpirun's daemon.
#
#   tests/gpu/dry_run.sh build-bundle/minidl-gpu.tar.xz
#
# Checks the report: env, load and cpu_smoke pass; every other step says "no GPU" and skips; summary.txt is printed
# and ends in PASS; OUTDIR holds at most 6 files of at most 16 MiB; the whole run takes under 90 s.
set -euo pipefail

if (( $# != 1 )) || [[ ! -f $1 ]]; then
  echo "dry_run: expected the bundle's .tar.xz, got '${1:-}'" >&2
  exit 2
fi
bundle_tar="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tar -C "$work" -xf "$bundle_tar"
report="$work/report"

hide=()
if [[ $EUID == 0 ]] && unshare -m true 2>/dev/null; then
  cat >"$work/hide.sh" <<'EOF'
#!/bin/bash
set -e
for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/openblas-openmp \
         /usr/share/openmpi /etc/openmpi; do
  if [[ -d $d ]]; then mount -t tmpfs none "$d"; fi
done
for f in /usr/bin/orted /usr/bin/orterun /usr/bin/mpirun /usr/bin/mpiexec; do
  if [[ -e $f ]]; then mount --bind /dev/null "$f"; fi
done
exec "$@"
EOF
  chmod +x "$work/hide.sh"
  hide=(unshare -m "$work/hide.sh")
  echo "dry_run: Open MPI's and OpenBLAS's folders and mpirun's daemon hidden (a mount namespace)"
else
  echo "dry_run: no mount namespace here (needs root and unshare): the system's Open MPI stays visible"
fi

t0=$SECONDS
rc=0
(cd / && "${hide[@]}" env -i /bin/bash "$work/minidl-gpu/scripts/gpu-run.sh" "$report") || rc=$?
elapsed=$(( SECONDS - t0 ))

fail() { echo "dry_run: FAIL: $*" >&2; cat "$report"/tests.log 2>/dev/null | tail -n 40 >&2; exit 1; }
(( rc == 0 )) || fail "gpu-run.sh exited $rc"
summary="$report/summary.txt"
[[ -f $summary ]] || fail "no summary.txt"
for name in env load cpu_smoke; do
  grep -Eq "^$name +rc 0 " "$summary" || fail "step $name did not pass: $(grep -E "^$name " "$summary")"
done
others="$(grep -Ev '^(env|load|cpu_smoke|result) ' "$summary" || true)"
[[ -n $others ]] || fail "summary.txt lists no GPU step"
bad="$(grep -v 'skipped .* no GPU$' <<<"$others" || true)"
[[ -z $bad ]] || fail "GPU steps that did not skip with 'no GPU': $bad"
tail -n 1 "$summary" | grep -q '^result .* PASS' || fail "the summary's last line is not a PASS: $(tail -n 1 "$summary")"
files=$(find "$report" -type f | wc -l)
(( files <= 6 )) || fail "$files files in OUTDIR (at most 6)"
big="$(find "$report" -type f -size +16M)"
[[ -z $big ]] || fail "files over 16 MiB: $big"
(( elapsed < 90 )) || fail "the dry run took ${elapsed}s (at most 90)"
echo "dry_run: passed in ${elapsed}s: $(grep -c 'no GPU$' <<<"$others") GPU steps skipped, $files files in the report"
