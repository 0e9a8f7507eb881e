#!/usr/bin/env python3
"""Where a Python benchmark's numbers come from: the twin of bench/provenance.h, with the same keys.

    import provenance                                # from bench/ (sys.path[0] when run as bench/<script>.py)
    prov = provenance.provenance()
    print(provenance.header(prov), end="")           # "# key: value" lines above the table
    json.dump({"provenance": prov, "rows": rows}, sys.stdout)

    bench/provenance.py                              # prints the JSON object

The CPU and the ISA the kernels would pick (Highway's best target: AVX-512 needs avx512f/bw/dq/vl, AVX2 needs
avx2/fma/bmi2; MINIDL_CPU_ISA forces one), CPUs and threads (OMP_NUM_THREADS), GPUs and interconnect from
nvidia-smi, the CUDA, cuBLAS and NCCL versions of the headers under CUDA_HOME (default /usr/local/cuda) or
/usr/include, Open MPI from mpirun --version, OpenBLAS from the library itself, the commit and the command line.
A field that cannot be known here is None.
"""
import ctypes
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _output(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return r.stdout if r.returncode == 0 else ""


def _cpuinfo():
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() and key.strip() not in fields:
                    fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_name():
    """As ops/cpu/simd/isa.h's host_cpu_name(): "model, family F model M, N CPUs"."""
    info = _cpuinfo()
    name = info.get("model name") or "unknown CPU"
    if info.get("cpu family") and info.get("model"):
        name += f", family {info['cpu family']} model {info['model']}"
    return f"{name}, {os.cpu_count()} CPUs"


def isa():
    forced = os.environ.get("MINIDL_CPU_ISA", "best")
    if forced != "best":
        return forced
    flags = set(_cpuinfo().get("flags", "").split())
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "avx512"
    if {"avx2", "fma", "bmi2"} <= flags:
        return "avx2"
    return "sse4"


def _header_define(names, pattern):
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for d in (os.path.join(cuda_home, "include"), "/usr/include"):
        for name in names:
            path = os.path.join(d, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    found = dict(re.findall(pattern, f.read(), re.M))
                if found:
                    return found
    return {}


def cuda_versions():
    rt = _header_define(["cuda_runtime_api.h"], r"^#define (CUDART_VERSION) +([0-9]+)")
    cuda = f"{int(rt['CUDART_VERSION']) // 1000}.{int(rt['CUDART_VERSION']) % 1000 // 10}" if rt else None
    b = _header_define(["cublas_api.h"], r"^#define (CUBLAS_VER_(?:MAJOR|MINOR|PATCH)) +([0-9]+)")
    cublas = f"{b['CUBLAS_VER_MAJOR']}.{b['CUBLAS_VER_MINOR']}.{b['CUBLAS_VER_PATCH']}" if len(b) == 3 else None
    n = _header_define(["nccl.h"], r"^#define (NCCL_(?:MAJOR|MINOR|PATCH)) +([0-9]+)")
    nccl = f"{n['NCCL_MAJOR']}.{n['NCCL_MINOR']}.{n['NCCL_PATCH']}" if len(n) == 3 else None
    return cuda, cublas, nccl


def gpus():
    out = _output(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
                   "--format=csv,noheader,nounits"])
    rows = []
    for line in out.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 4:
            rows.append({"name": f[0], "driver": f[1], "sm_clock_max_mhz": f[2], "power_limit_w": f[3]})
    return rows


def open_mpi():
    m = re.search(r"\(Open MPI\) ([0-9.]+)", _output(["mpirun", "--version"]))
    return f"Open MPI {m.group(1)}" if m else None


def openblas():
    """(version, core) from the OpenBLAS library the build links (the OpenMP one on Debian), or any other."""
    for lib in ("/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                "/usr/lib/aarch64-linux-gnu/openblas-openmp/libopenblas.so.0", "libopenblas.so.0"):
        try:
            so = ctypes.CDLL(lib)
        except OSError:
            continue
        so.openblas_get_config.restype = ctypes.c_char_p
        so.openblas_get_corename.restype = ctypes.c_char_p
        m = re.search(r"OpenBLAS ([0-9.]+)", so.openblas_get_config().decode())
        return (m.group(1) if m else None), so.openblas_get_corename().decode().strip() or None
    return None, None


def commit():
    sha = _output(["git", "-C", ROOT, "rev-parse", "HEAD"]).strip()
    if sha and _output(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"]).strip():
        sha += "-dirty"
    return sha or None


def provenance(argv=None):
    cuda, cublas, nccl = cuda_versions()
    version, core = openblas()
    topo = _output(["nvidia-smi", "topo", "-m"]).strip()
    return {"cpu": cpu_name(), "isa": isa(), "cpus": os.cpu_count(),
            "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count(),
            "gpus": gpus(), "interconnect": topo or None, "device_backend": None,
            "cuda": cuda, "cublas": cublas, "nccl": nccl, "open_mpi": open_mpi(),
            "openblas": version, "openblas_core": core, "commit": commit(),
            "command": " ".join(argv if argv is not None else sys.argv), "build": None}


def header(prov):
    """The provenance as "# key: value" lines (the interconnect's matrix indented below its key)."""
    lines = []
    for key, value in prov.items():
        if key == "interconnect" and value:
            lines.append("# interconnect:")
            lines += ["#   " + line for line in value.splitlines()]
        else:
            lines.append(f"# {key}: {value if isinstance(value, str) else json.dumps(value)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(provenance(), indent=2))
