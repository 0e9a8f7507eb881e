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
    # --json-out: the same object in a file a driver reads without parsing the output (scripts/gpu-run.sh), with
    # every timed step's ms and their min <= median <= max.
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.json")
        cmd = [os.path.join(bin_dir, "bench_gpt_step")] + programs["bench_gpt_step"][:-6] + ["--steps", "3", "--warmup", "0",
                                                                                            "--threads", "1"]
        printed = json.loads(run(cmd + ["--json", "--json-out", path]).strip().splitlines()[-1])
        check(os.path.exists(path) and not os.path.exists(path + ".part"), "--json-out left no file, or its .part")
        if os.path.exists(path):
            with open(path) as f:
                written = json.load(f)
            check(written == printed, "--json-out's object differs from the printed one")
            steps = written.get("ms_steps", [])
            check(len(steps) == 3, f"ms_steps has {len(steps)} entries, expected 3")
            check(written["ms_min"] <= written["ms_per_step"] <= written["ms_max"], "min <= median <= max fails")
            check(abs(written["ms_min"] - min(steps)) < 1e-3 and abs(written["ms_max"] - max(steps)) < 1e-3,
                  "ms_min/ms_max are not the extremes of ms_steps")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("provenance: every benchmark's JSON and table carry it, and the C++ and Python twins agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
