#!/bin/sh
# expect_job_fails.sh <seconds> <command...>: passes when the command exits non-zero within <seconds>; fails when
# it succeeds or is still running at the deadline (a hang).
limit=$1
shift
timeout --kill-after=5 "$limit" "$@"
status=$?
if [ "$status" -eq 0 ]; then
  echo "expect_job_fails: the job exited 0, expected a failure" >&2
  exit 1
elif [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "expect_job_fails: the job was still running after ${limit}s (hang)" >&2
  exit 1
fi
echo "expect_job_fails: the job failed with status $status, as expected"
exit 0
