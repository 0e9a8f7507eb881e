#!/bin/sh
# Open MPI's launch agent for the "hosts" of test_multi_host.py, which are network namespaces of this machine.
# mpirun calls its agent as it would call ssh (--mca plm_rsh_agent netns_agent.sh):
#
#   netns_agent.sh [ssh options] HOST COMMAND...
#
# and this runs COMMAND, one shell command line as ssh would hand it to the remote shell (mpirun's orted with its
# arguments), inside the namespace that MINIDL_NETNS_HOSTS maps HOST to: "10.77.3.1=ns_a 10.77.3.2=ns_b" (mpirun
# passes its environment to the agent), under the namespace's name as hostname (so letters, digits and '-'). HOST is
# an address of the namespace, the name the hostfile gives.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh's options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "netns_agent.sh: expected [ssh options] HOST COMMAND..., got '$*'" >&2
  exit 255
fi
host=$1
shift
for pair in $MINIDL_NETNS_HOSTS; do
  if [ "${pair%%=*}" = "$host" ]; then
    # Its own hostname too (a UTS namespace): Open MPI names its session directory in /tmp, which the namespaces
    # share, after the host; with one name for both, a 4-rank job that split off a shared-memory communicator
    # crashed or hung at its end.
    exec ip netns exec "${pair#*=}" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "${pair#*=}" "$*"
  fi
done
echo "netns_agent.sh: host $host is not in MINIDL_NETNS_HOSTS ('$MINIDL_NETNS_HOSTS')" >&2
exit 255
