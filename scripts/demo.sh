#!/usr/bin/env bash
# Trains the small character-level GPT on Tiny Shakespeare and prints samples, from any working directory.
#
#   scripts/demo.sh                     # 2000 steps of a 4-layer, 4-head, 128-wide GPT
#   scripts/demo.sh --steps 200         # extra arguments go to train_gpt and override the defaults below
#
# The corpus defaults to data/tinyshakespeare.txt, shipped in the repository (train_gpt resolves it); pass
# --data FILE to use another one.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${MINIDL_BUILD_DIR:-build}"

"$root/scripts/install-deps.sh"
MINIDL_BUILD_TARGETS="${MINIDL_BUILD_TARGETS:-train_gpt}" "$root/scripts/build.sh"  # only what the demo runs

train_gpt="$root/$build_dir/bin/train_gpt"
if [[ ! -x "$train_gpt" ]]; then
  echo "demo: $train_gpt was not built (examples/CMakeLists.txt does not define train_gpt yet?)" >&2
  exit 1
fi

defaults=(--layers 4 --heads 4 --embd 128 --seq 64 --batch 12 --steps 2000 --lr 1e-3 --sample 500)

# Pass each default only if the user did not give that flag, so every flag reaches train_gpt once.
args=()
for (( i = 0; i < ${#defaults[@]}; i += 2 )); do
  flag="${defaults[i]}"
  given=0
  for user_arg in "$@"; do
    if [[ "$user_arg" == "$flag" || "$user_arg" == "$flag="* ]]; then given=1; break; fi
  done
  (( given )) || args+=("$flag" "${defaults[i + 1]}")
done

echo "demo: $train_gpt ${args[*]} $*"
exec "$train_gpt" "${args[@]}" "$@"
