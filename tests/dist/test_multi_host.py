#!/usr/bin/env python3
"""Training across two hosts gives the one-process result. The hosts are two network namespaces of this machine
joined by a veth pair, each with its own address; mpirun runs in the first and reaches the second through
netns_agent.sh, a launch agent that stands in for ssh by entering the namespace, under a hostname of its own
(--mca plm_rsh_agent), and Open MPI must talk TCP over the veth (btl tcp,self and oob, both restricted to its
subnet). Both namespaces share this
machine's file system, as hosts with a shared file system would: each rank reads the corpus and writes its part of a
checkpoint directly.

- every rank runs on the host the hostfile placed it (1 or 2 per host), and minidl's local rank and ranks-on-host
  agree with Open MPI's shared-memory split (test_dist's Context.AgreesWithMpi): 1 and 2 ranks per host;
- DDP (ring), ZeRO-2 (mpi), tensor parallelism (--tp 2; and dp 2 x tp 2, tp within a host and dp across) and a
  pipeline whose two stages sit on different hosts, and (emulated CUDA builds) DDP over "nccl" on the device: the
  summary's losses of one process within kF32SumOrder (tests/support/loss_agreement.h), as the one-host tests
  compare them; the gradients really crossed the veth;
- a ZeRO-2 checkpoint written across hosts (each host's rank writes its share) resumes on one process to the
  validation loss of the run that never stopped.

Exits 77 (CTest: skipped) when not root or when the namespaces or the veth pair cannot be made. The namespaces and
the veth (named with this process's id) are removed, and the processes left in them ended, even on failure; those
of an earlier run that was killed are removed at the start.

    test_multi_host.py MPIEXEC TRAIN_GPT TEST_DIST [emulated|none]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
AGENT = os.path.join(HERE, "netns_agent.sh")
SKIP = 77
JOB_TIMEOUT = 180  # seconds for one job; a normal one takes under 2, one took over 60 on a loaded CI machine
DEADLINE = time.time() + 240  # for all jobs: ends before CTest's TIMEOUT (300 s), so that the cleanup runs
failures = []


def time_left():
    """Seconds the next job may take (at least 1: a job past the deadline fails at once)."""
    return max(1.0, min(JOB_TIMEOUT, DEADLINE - time.time()))


def check_(ok, what):
    print(("ok: " if ok else "FAIL: ") + what, flush=True)
    if not ok:
        failures.append(what)


def tolerance(name):
    """A tolerance of tests/support/loss_agreement.h, so that this test and the C++ ones share one number."""
    text = open(os.path.join(ROOT, "tests", "support", "loss_agreement.h")).read()
    return float(re.search(r"constexpr double " + name + r" = ([0-9.e+-]+);", text).group(1))


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


class Hosts:
    """Two namespaces, `names[h]`, joined by a veth pair whose ends `veths[h]` have the addresses `addrs[h]`.

    The subnet need not be unique: each namespace has its own routing, and the agent maps addresses to namespaces
    through MINIDL_NETNS_HOSTS, which this object sets for mpirun alone."""

    PREFIX = "minidl-mh"
    SUBNET = "10.77.3.0/24"

    def __init__(self, work):
        pid = os.getpid()
        self.hostfile = os.path.join(work, "hosts")
        self.names = [f"{self.PREFIX}{pid}-{h}" for h in "ab"]  # also the hostnames: no "_"
        self.veths = [f"mdl{pid}{h}" for h in "ab"]  # an interface name has at most 15 characters
        self.addrs = ["10.77.3.1", "10.77.3.2"]

    @classmethod
    def remove_stale(cls):
        """Namespaces of earlier runs whose process is gone (a run killed by CTest's timeout cannot clean up)."""
        for line in ip("netns", "list").stdout.splitlines():
            m = re.match(cls.PREFIX + r"(\d+)-[ab]\b", line)
            if m and not os.path.exists(f"/proc/{m.group(1)}"):
                remove_namespace(line.split()[0])

    def create(self):
        """None when it worked, else why not (the command and its message)."""
        a, b = self.names
        va, vb = self.veths
        steps = [("netns", "add", a), ("netns", "add", b),
                 ("link", "add", va, "type", "veth", "peer", "name", vb),
                 ("link", "set", va, "netns", a), ("link", "set", vb, "netns", b)]
        for h in range(2):
            steps += [("-n", self.names[h], "addr", "add", self.addrs[h] + "/24", "dev", self.veths[h]),
                      ("-n", self.names[h], "link", "set", self.veths[h], "up"),
                      ("-n", self.names[h], "link", "set", "lo", "up")]
        for step in steps:
            r = ip(*step)
            if r.returncode != 0:
                return f"'ip {' '.join(step)}' failed: {r.stderr.strip()}"
        return None

    def remove(self):
        for name in self.names:
            remove_namespace(name)
        for veth in self.veths:  # left in this namespace only when create() failed before moving it
            if ip("link", "show", veth).returncode == 0:
                ip("link", "del", veth)

    def end_processes(self):
        for name in self.names:
            end_namespace_processes(name)

    def veth_bytes(self):
        """Bytes the second host's veth end has sent and received."""
        r = ip("-n", self.names[1], "-j", "-s", "link", "show", "dev", self.veths[1])
        stats = json.loads(r.stdout)[0]["stats64"]
        return stats["tx"]["bytes"] + stats["rx"]["bytes"]

    def mpirun(self, mpiexec, ranks_per_host, command):
        """Runs `command` (a list) on 2 x ranks_per_host ranks, ranks 0.. on the first host; (exit code, output)."""
        with open(self.hostfile, "w") as f:
            f.writelines(f"{addr} slots={ranks_per_host}\n" for addr in self.addrs)
        cmd = ["ip", "netns", "exec", self.names[0], mpiexec, "-n", str(2 * ranks_per_host), "--hostfile", self.hostfile,
               "--map-by", f"ppr:{ranks_per_host}:node", "--allow-run-as-root",
               "--mca", "plm_rsh_agent", AGENT, "--mca", "plm_rsh_no_tree_spawn", "1",
               "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", self.SUBNET,
               "--mca", "oob_tcp_if_include", self.SUBNET, "-x", "OMP_NUM_THREADS=1", *command]
        env = dict(os.environ, MINIDL_NETNS_HOSTS=" ".join(f"{a}={n}" for a, n in zip(self.addrs, self.names)),
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        timeout = time_left()
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            return r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired as e:
            self.end_processes()  # mpirun is killed; its daemon and ranks are not
            return None, f"still running after {timeout:.0f} s: {e.stdout or ''}{e.stderr or ''}"


def end_namespace_processes(name):
    """Ends the processes this test started in namespace `name` (mpirun, its daemon, ranks), by their ids."""
    for pid in ip("netns", "pids", name).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def remove_namespace(name):
    end_namespace_processes(name)
    ip("netns", "del", name)  # removes the veth end inside it, and so the pair


def summary(out, key):
    m = re.search(r"summary: .*?\b" + key + r"=([-0-9.e+naif]+)", out)
    return float(m.group(1)) if m else float("nan")


def same_losses(what, got, want, rtol, keys=("train_loss", "val_loss")):
    for key in keys:
        g, w = summary(got, key), summary(want, key)
        rel = abs(g - w) / abs(w) if w == w and w != 0 else float("inf")
        check_(rel <= rtol, f"{what}: {key} {g:.9g} against one process's {w:.9g}, relative {rel:.2g} "
                            f"(tolerance {rtol:g})")


def main():
    mpiexec, train_gpt, test_dist = sys.argv[1:4]
    device = sys.argv[4] if len(sys.argv) > 4 else "none"
    if os.geteuid() != 0:
        print("SKIP: creating network namespaces and a veth pair needs root")
        return SKIP
    if shutil.which("ip") is None:
        print("SKIP: no 'ip' command (iproute2) to create network namespaces")
        return SKIP
    Hosts.remove_stale()
    work = tempfile.mkdtemp(prefix="minidl_multi_host_")
    hosts = Hosts(work)
    # CTest's timeout sends SIGTERM first on some platforms: clean up then too (SIGKILL is remove_stale's part).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        why = hosts.create()
        if why:
            print(f"SKIP: network namespaces joined by a veth pair cannot be made here: {why}")
            return SKIP
        run_checks(hosts, mpiexec, train_gpt, test_dist, work, device)
    finally:
        hosts.remove()
        shutil.rmtree(work, ignore_errors=True)
    left = [n for n in hosts.names if n in ip("netns", "list").stdout]
    check_(not left, f"the namespaces are removed (left: {left})")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


def run_checks(hosts, mpiexec, train_gpt, test_dist, work, device):
    f32 = tolerance("kF32SumOrder")

    # Placement: the hostfile's order, ranks 0.. on the first host, each rank's namespace and Open MPI's local rank.
    for per_host in (1, 2):
        code, out = hosts.mpirun(mpiexec, per_host, ["sh", "-c", 'echo "rank $OMPI_COMM_WORLD_RANK in '
                                                     '$(ip netns identify $$) local $OMPI_COMM_WORLD_LOCAL_RANK"'])
        want = {f"rank {r} in {hosts.names[r // per_host]} local {r % per_host}" for r in range(2 * per_host)}
        got = set(l for l in out.splitlines() if l.startswith("rank "))
        check_(code == 0 and got == want, f"{per_host} rank(s) per host placed as {sorted(want)} (exit {code})"
                                          + ("" if got == want else f": {out}"))
        # minidl's own local rank and ranks-on-host against MPI's shared-memory split, on each host.
        code, out = hosts.mpirun(mpiexec, per_host, [test_dist, "--gtest_filter=Context.*", "--gtest_color=no"])
        check_(code == 0 and "[  PASSED  ] 1 test" in out,
               f"test_dist Context.* at {per_host} rank(s) per host (exit {code})" + ("" if code == 0 else f": {out}"))

    data = os.path.join(work, "tiny.txt")
    with open(data, "w") as f:
        f.write("the quick brown fox. " * 200)

    def gpt(layers=1, heads=2, embd=16, steps=20, extra=""):  # test_train_gpt.cpp's tiny model, with dropout
        return (f"--data {data} --layers {layers} --heads {heads} --embd {embd} --seq 16 --batch 8 --threads 1 "
                f"--eval-windows 4 --log-every 1000 --steps {steps} --lr 3e-3 --dropout 0.1 {extra}").split()

    def one(flags):
        r = subprocess.run([train_gpt, *flags], capture_output=True, text=True, timeout=time_left())
        check_(r.returncode == 0, f"one process {' '.join(flags[-4:])} (exit {r.returncode})"
                                  + ("" if r.returncode == 0 else f": {r.stdout}{r.stderr}"))
        return r.stdout

    def across(what, per_host, flags, reference):
        before = hosts.veth_bytes()
        code, out = hosts.mpirun(mpiexec, per_host, [train_gpt, *flags])
        check_(code == 0, f"{what} (exit {code})" + ("" if code == 0 else f": {out}"))
        if code == 0:
            same_losses(what, out, reference, f32)
        return out, hosts.veth_bytes() - before

    reference = one(gpt())
    _, moved = across("DDP, ring, 1 rank per host", 1, gpt(extra="--backend ring"), reference)
    # The ring's all-reduce sends each rank's gradients (16 KiB at least in f32) once per step across the veth.
    check_(moved >= 20 * 16 * 1024, f"the gradients crossed the veth: {moved} bytes during 20 steps")
    across("ZeRO-2, mpi, 1 rank per host", 1, gpt(extra="--zero 2 --backend mpi"), reference)

    reference = one(gpt(heads=4))
    across("tensor parallel --tp 2, ring, 1 rank per host", 1, gpt(heads=4, extra="--tp 2 --backend ring"), reference)
    across("dp 2 x tp 2, tp within a host, 2 ranks per host", 2, gpt(heads=4, extra="--dp 2 --tp 2"), reference)

    # Stage 0 on the first host, stage 1 on the second (pp rank = world rank at dp 1, tp 1: dist/topology.h);
    # one process accumulates over the same 4 micro-batches.
    reference = one(gpt(layers=4, steps=10, extra="--grad-accum 4"))
    across("pipeline --pp 2 (1F1B), a stage per host", 1,
           gpt(layers=4, steps=10, extra="--pp 2 --micro-batches 4 --schedule 1f1b"), reference)

    # On the emulated CUDA device, DDP over the "nccl" backend (the emulated NCCL moves its data over MPI, so
    # through the same TCP transport: NCCL's own sockets, NCCL_SOCKET_IFNAME, are not what this checks).
    if device == "emulated":
        reference = one(gpt(embd=32, steps=5, extra="--device cuda"))
        across("DDP on the emulated CUDA device, nccl, 1 rank per host", 1,
               gpt(embd=32, steps=5, extra="--device cuda --backend nccl"), reference)

    # A ZeRO-2 checkpoint written across hosts (optimizer-00001-of-00002 by the second host's rank) resumes on one
    # process: 8 steps straight against 4 across hosts + 4 on one process.
    ckpt = os.path.join(work, "ck")
    resume_flags = gpt(steps=8, extra="--warmup 2 --min-lr 1e-4 --eval-every 0")
    straight = one(resume_flags)
    code, out = hosts.mpirun(mpiexec, 1, [train_gpt, *resume_flags, "--zero", "2", "--checkpoint-dir", ckpt,
                                          "--save-every", "4"])
    step4 = os.path.join(ckpt, "step-00000004")
    check_(code == 0 and os.path.exists(os.path.join(step4, "optimizer-00001-of-00002.safetensors")),
           f"ZeRO-2 across hosts writes step 4 with both ranks' optimizer shares (exit {code})"
           + ("" if code == 0 else f": {out}"))
    shutil.rmtree(os.path.join(ckpt, "step-00000008"), ignore_errors=True)
    resumed = one(resume_flags + ["--checkpoint-dir", ckpt, "--resume", "auto"])
    check_("step-00000004" in resumed, "one process resumes from step 4" + ("" if "step-00000004" in resumed
                                                                            else f": {resumed}"))
    same_losses("resumed on one process from the checkpoint written across hosts", resumed, straight, f32,
                keys=("val_loss",))


if __name__ == "__main__":
    sys.exit(main())
