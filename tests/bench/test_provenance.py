#!/usr/bin/env python3
"""Every benchmark's --json carries the provenance of bench/provenance.h, and its C++ and Python twins agree.

    tests/bench/test_provenance.py BIN_DIR

Runs bench_cpu_ops, bench_collectives (one rank) and bench_gpt_step with --json at tiny sizes and bench/provenance.py,
and checks: the same keys everywhere; the machine's facts found both ways agree (CPU, ISA, CPUs, Open MPI, OpenBLAS,
commit; CUDA, cuBLAS and NCCL where the build compiled against them); the CPU model and count are lscpu's; the
command is the one run; and a table's header carries the same lines. Exit status 0 when all hold.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import provenance  # noqa: E402

HOST_FACTS = ["cpu", "isa", "cpus", "open_mpi", "openblas", "openblas_core", "commit"]
BUILD_FACTS = ["cuda", "cublas", "nccl"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAILED:", what)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def main():
    bin_dir = sys.argv[1]
    python = provenance.provenance()
    lscpu = dict(line.split(":", 1) for line in run(["lscpu"]).splitlines() if ":" in line)
    model = lscpu.get("Model name", "").strip()
    check(python["cpu"].startswith(model) and python["cpus"] == int(lscpu["CPU(s)"]),
          f"provenance.py's CPU {python['cpu']!r} ({python['cpus']} CPUs) is not lscpu's {model!r} ({lscpu['CPU(s)']})")

    programs = {
        "bench_cpu_ops": ["--numel", "4096", "--rows", "8", "--reps", "1", "--threads", "1", "--ops", "layernorm",
                          "--isa", "best"],
        "bench_collectives": ["--min-bytes", "1K", "--max-bytes", "1K", "--iters", "1", "--warmup", "0"],
        "bench_gpt_step": ["--layers", "1", "--heads", "2", "--embd", "32", "--seq", "16", "--batch", "2",
                           "--steps", "1", "--warmup", "0", "--threads", "1"],
    }
    for name, flags in programs.items():
        cmd = [os.path.join(bin_dir, name)] + flags
        out = run(cmd + ["--json"])
        # bench_gpt_step prints its table and then one JSON object as the last line; the others one JSON object.
        doc = json.loads(out.strip().splitlines()[-1] if name == "bench_gpt_step" else out)
        prov = doc.get("provenance") if isinstance(doc, dict) else None
        check(isinstance(prov, dict), f"{name} --json has no provenance object: {out[:300]}")
        if not isinstance(prov, dict):
            continue
        check(set(prov) == set(python), f"{name}'s keys {sorted(prov)} differ from provenance.py's {sorted(python)}")
        for key in HOST_FACTS:
            check(prov.get(key) == python[key], f"{name} says {key}={prov.get(key)!r}, provenance.py {python[key]!r}")
        for key in BUILD_FACTS:
            if prov.get(key) is not None:
                check(prov[key] == python[key], f"{name} says {key}={prov[key]!r}, the headers {python[key]!r}")
        check(prov.get("command") == " ".join(cmd + ["--json"]), f"{name}'s command {prov.get('command')!r}")
        check(bool(prov.get("build")), f"{name} names no build flags")
        table = run(cmd)
        for key in ["cpu", "commit", "open_mpi", "openblas"]:
            line = f"# {key}: {prov[key]}"
            check(line in table.splitlines(), f"{name}'s table header lacks {line!r}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("provenance: every benchmark's JSON and table carry it, and the C++ and Python twins agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
