#!/usr/bin/env bash
# Installs the Debian 12 packages that minidl needs to build and run its tests.
#
#   scripts/install-deps.sh                # build + test dependencies
#   scripts/install-deps.sh --with-torch   # also python3-torch and python3-numpy (bench/compare_pytorch.py only)
#   scripts/install-deps.sh --with-plot    # also python3-matplotlib (scripts/plot.py, bench/scaling.py --plot; CI too)
#   scripts/install-deps.sh --with-oracles # the real clients the tests compare with (CI installs them): Debian's
#                                          # python3-torch, and transformers, safetensors, tiktoken and tensorboard
#                                          # from PyPI in a virtual environment (MINIDL_ORACLES_VENV, default
#                                          # /opt/minidl-oracles) that also sees python3-torch
#
# Idempotent: every package is checked with dpkg first, and apt-get (update + install) runs only when something
# is missing, so a second run is a no-op that takes a fraction of a second. Runs as root, or through sudo when
# not root. CUDA is not installed from apt (Debian 12 has no CUDA 13); it is expected under /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential         # g++ 12, make
  cmake                   # 3.25
  ninja-build
  ccache                  # used automatically by CMakeLists.txt when present
  libopenblas-openmp-dev  # OpenBLAS built for OpenMP (cmake/MinidlBlas.cmake links this flavour)
  libopenmpi-dev          # mpicxx, headers (dist/)
  openmpi-bin             # mpirun / mpiexec (multi-rank tests)
  nlohmann-json3-dev
  libcli11-dev
  libgtest-dev
  libgmock-dev
  libboost-context-dev    # fibers for the CPU emulation of CUDA kernels
  clang                   # libFuzzer for the checkpoint-reader fuzzer (scripts/fuzz.sh)
  clang-format            # 14: scripts/format.sh, checked in CI
  libpcre2-dev            # PCRE2: GPT-2's pre-tokenisation pattern over Unicode categories (data/bpe_tokenizer.h)
  pkg-config              # finds PCRE2 (Debian ships no CMake package for it)
  libhwy-dev              # Google Highway: portable SIMD, vector exp/tanh and runtime ISA dispatch (ops/cpu/simd/)
  patchelf                # scripts/gpu-bundle.sh: the bundle's programs and libraries find each other ($ORIGIN)
  xz-utils                # scripts/gpu-bundle.sh: the bundle's .tar.xz
)
torch_packages=(python3-torch python3-numpy)
plot_packages=(python3-matplotlib)
# PyPI's oracles, pinned: transformers 4.36 is the last line that supports Debian 12's torch 1.13 in full.
oracle_requirements=(transformers==4.36.2 safetensors==0.4.5 tiktoken==0.8.0 tensorboard==2.18.0)
oracles_venv="${MINIDL_ORACLES_VENV:-/opt/minidl-oracles}"
with_oracles=0

usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

for arg in "$@"; do
  case "$arg" in
    --with-torch) packages+=("${torch_packages[@]}") ;;
    --with-plot) packages+=("${plot_packages[@]}") ;;
    --with-oracles) packages+=("${torch_packages[@]}" python3-venv python3-pip); with_oracles=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (expected --with-torch, --with-plot, --with-oracles or --help)" >&2
       exit 2 ;;
  esac
done

# The oracles' virtual environment, on Debian's python3 (the interpreter that has python3-torch); redone only when
# the pinned list changes (its copy in the environment says what is installed).
install_oracles() {
  local stamp="$oracles_venv/minidl-requirements.txt"
  if [[ -f $stamp && "$(cat "$stamp")" == "${oracle_requirements[*]}" ]]; then
    echo "install-deps: oracles already in $oracles_venv (${oracle_requirements[*]})"
    return 0
  fi
  echo "install-deps: the oracles into $oracles_venv: ${oracle_requirements[*]}"
  /usr/bin/python3 -m venv --system-site-packages "$oracles_venv"
  "$oracles_venv/bin/python" -m pip install --quiet --disable-pip-version-check "${oracle_requirements[@]}"
  "$oracles_venv/bin/python" -c 'import torch, transformers, safetensors, tiktoken, tensorboard' ||
    { echo "install-deps: the oracles do not import in $oracles_venv" >&2; return 1; }
  echo "${oracle_requirements[*]}" >"$stamp"
}

if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install-deps: dpkg-query/apt-get not found; this script supports Debian 12 (bookworm) only." >&2
  echo "install-deps: install these packages (or their equivalents) yourself: ${packages[*]}" >&2
  exit 1
fi

# `dpkg -s` alone also succeeds for a removed package whose config files remain, so compare the full status.
is_installed() { [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]; }

missing=()
for p in "${packages[@]}"; do
  is_installed "$p" || missing+=("$p")
done

if (( ${#missing[@]} == 0 )); then
  echo "install-deps: nothing to do (all ${#packages[@]} packages already installed)"
  (( with_oracles == 0 )) || install_oracles
  exit 0
fi

if (( EUID == 0 )); then
  as_root=()
elif command -v sudo >/dev/null; then
  as_root=(sudo)
else
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: installing them needs root, and sudo is not available. Run this script as root." >&2
  exit 1
fi

echo "install-deps: installing ${#missing[@]} missing package(s): ${missing[*]}"
# `env` passes DEBIAN_FRONTEND through sudo (which resets the environment). The lock timeout waits for a
# concurrent apt/dpkg run (e.g. unattended-upgrades on a fresh CI machine) instead of failing at once.
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q)
"${apt[@]}" update
"${apt[@]}" install -y --no-install-recommends "${missing[@]}"

still_missing=()
for p in "${missing[@]}"; do
  is_installed "$p" || still_missing+=("$p")
done
if (( ${#still_missing[@]} > 0 )); then
  echo "install-deps: apt-get finished but these packages are still not installed: ${still_missing[*]}" >&2
  exit 1
fi

echo "install-deps: installed:"
for p in "${missing[@]}"; do
  printf '  %-24s %s\n' "$p" "$(dpkg-query -W -f='${Version}' "$p")"
done
(( with_oracles == 0 )) || install_oracles
