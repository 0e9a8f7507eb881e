#!/usr/bin/env bash
# Fault trials for training checkpoints: each trial starts a 2-rank train_gpt run with --save-every 5, kill -9s a
# random rank at a random step, reruns the very same command (--resume auto) until it finishes, and compares the
# final weights with an uninterrupted run byte for byte. Prints one line per trial and a summary; exit 1 if any
# trial's weights differ or a rerun cannot load what --resume auto picked.
#
#   scripts/fault_trials.sh            # 10 trials
#   scripts/fault_trials.sh 3          # what CTest runs (tests/examples)
#
# TRAIN_GPT (default build/bin/train_gpt) and MINIDL_DATA (default data/tinyshakespeare.txt) select the binary
# and the corpus.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trials="${1:-10}"
bin="${TRAIN_GPT:-$root/build/bin/train_gpt}"
data="${MINIDL_DATA:-$root/data/tinyshakespeare.txt}"
[[ -x "$bin" ]] || { echo "fault_trials: no train_gpt at $bin (build first, or set TRAIN_GPT)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mpirun=(mpirun -n 2 --oversubscribe --allow-run-as-root)
flags=(--data "$data" --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4
       --eval-every 0 --log-every 1 --dropout 0.1 --lr 3e-3 --steps 600 --save-every 5 --progress lines)

OMP_NUM_THREADS=1 "${mpirun[@]}" "$bin" "${flags[@]}" --checkpoint-dir "$work/straight-ck" --save "$work/straight.safetensors" >"$work/straight.log" 2>&1 ||
  { echo "fault_trials: the uninterrupted run failed:" >&2; tail "$work/straight.log" >&2; exit 2; }

failed=0
printf '%-6s %-12s %-10s %-14s %-10s %s\n' trial killed_at resumed steps_lost reruns weights
for ((t = 1; t <= trials; ++t)); do
  ck="$work/ck$t"
  cmd=("${mpirun[@]}" "$bin" "${flags[@]}" --checkpoint-dir "$ck" --resume auto --save "$work/t$t.safetensors")
  OMP_NUM_THREADS=1 "${cmd[@]}" >"$work/t$t.log" 2>&1 &
  launcher=$!
  # The kill comes at a random step K in [6, 590], once the log shows it: a fixed delay would land after the last
  # step on a quiet machine (a step of this model takes about a millisecond) and before the first on a loaded one.
  kill_step=$((6 + RANDOM % 585))
  for ((w = 0; w < 3000; ++w)); do
    grep -q "^step $kill_step/" "$work/t$t.log" 2>/dev/null && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.02
  done
  mapfile -t ranks < <(pgrep -f "^$bin .*--checkpoint-dir $ck ")
  killed_at="finished"
  if ((${#ranks[@]} > 0)); then
    victim="${ranks[RANDOM % ${#ranks[@]}]}"
    kill -9 "$victim" 2>/dev/null
    killed_at="step $(grep -o '^step [0-9]*' "$work/t$t.log" | tail -n 1 | cut -d' ' -f2)"
  fi
  wait "$launcher" 2>/dev/null
  reruns=0
  until grep -q '^summary:' "$work/t$t.log"; do
    ((reruns++ < 3)) || break
    OMP_NUM_THREADS=1 "${cmd[@]}" >"$work/t$t.log" 2>&1
  done
  resumed="$(grep -o 'resuming from .*step-0*[0-9]*' "$work/t$t.log" | grep -o '[0-9]*$' | sed 's/^0*//')"
  resumed="${resumed:-0}"
  lost="-"
  [[ "$killed_at" == step* ]] && lost=$(( ${killed_at#step } - resumed ))
  if [[ -f "$work/t$t.safetensors" ]] && cmp -s "$work/straight.safetensors" "$work/t$t.safetensors"; then
    verdict="bitwise-equal"
  else
    verdict="DIFFERENT"
    failed=1
    tail -n 5 "$work/t$t.log"
  fi
  printf '%-6s %-12s %-10s %-14s %-10s %s\n' "$t" "$killed_at" "step $resumed" "$lost" "$reruns" "$verdict"
done
echo "fault trials: $trials, $([[ $failed == 0 ]] && echo "all bitwise equal to the uninterrupted run" || echo "SOME DIFFER")"
exit "$failed"
