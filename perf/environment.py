"""The machine a run measured: CPU, versions, thread settings and which BLAS each
contender calls (threadpoolctl for numpy's and scipy's, torch's own build config)."""
import os
import platform
import re

import numba
import numpy as np
import scipy

import jitgraph
from jitgraph.blas import cpuinfo

OPENBLAS_VARS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def cpu_model():
    return cpuinfo().get("model name") or platform.processor() or "unknown"


def cpu_vendor():
    """Vendor, family and model (e.g. "AuthenticAMD family 25 model 1"): the code paths
    BLAS libraries take depend on them."""
    info = cpuinfo()
    vendor = info.get("vendor_id") or platform.machine()
    family, model = info.get("cpu family"), info.get("model")
    return f"{vendor} family {family} model {model}" if family else vendor


def usable_cpus():
    """CPUs this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def load_average():
    """Other processes on the machine skew every figure: the load says how busy it was."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def blas_owner(path):
    """Which package a BLAS library file ships with (numpy.libs/ -> numpy)."""
    parts = os.path.normpath(path or "").split(os.sep)
    for p in reversed(parts[:-1]):
        for pkg in ("numpy", "scipy", "torch"):
            if p == pkg or p.startswith(pkg + "."):
                return pkg
    return "system"


def numpy_build_blas():
    """The BLAS numpy was built against (np.show_config), for runs without threadpoolctl."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return {"name": blas.get("name"), "version": blas.get("version")}
    except Exception:   # older numpy, or a build without this section
        return None


def torch_blas(torch):
    """torch links its BLAS statically, out of threadpoolctl's sight: read its build config."""
    cfg = torch.__config__.show()
    found = re.search(r"BLAS_INFO=(\w+)", cfg)
    # the library's own line, e.g. "Intel(R) oneAPI Math Kernel Library Version 2024.2-..."
    lib = [line.strip(" -") for line in cfg.splitlines() if re.search(r"Math Kernel|OpenBLAS|MKL-DNN", line)]
    return {"internal_api": found.group(1) if found else None, "version": "; ".join(lib) or None,
            "num_threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn": bool(torch.backends.mkldnn.is_available()),
            "mkl": bool(torch.backends.mkl.is_available()),
            "note": "statically linked, not visible to threadpoolctl"}


def probe(torch, threads):
    env = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu_model": cpu_model(), "cpu_vendor": cpu_vendor(), "cpu_count": os.cpu_count(), "usable_cpus": usable_cpus(),
        "threads": threads,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
                     "scipy": scipy.__version__, "torch": getattr(torch, "__version__", None),
                     "jitgraph": jitgraph.__version__},
        "env_vars": {k: os.environ.get(k) for k in OPENBLAS_VARS + THREAD_VARS},
        "load_average_at_start": load_average(),
    }
    try:
        from threadpoolctl import threadpool_info
        pools = threadpool_info()
    except ImportError:
        pools = None
    env["threadpools"] = pools
    env["numpy_build_blas"] = numpy_build_blas() if pools is None else None
    # which BLAS each contender calls: numpy's own; jitgraph's products call the library
    # blas.chosen picked on this host (by measurement, or JITGRAPH_BLAS); torch's is linked in
    from jitgraph import blas as jg_blas
    lib = jg_blas.chosen(np.float32)
    ours = os.path.realpath(lib.path)
    env["jitgraph_blas"] = {"chosen": lib.name, "version": lib.version, "kernel": lib.kernel,
                            "line": jg_blas.describe(np.float32), "measured": jg_blas.timings(np.float32)}
    from jitgraph import _target
    env["jitgraph_vectors"] = _target.describe()
    blas = {}
    for p in pools or []:
        if p.get("user_api") == "blas":
            owner = blas_owner(p.get("filepath"))
            who = owner + (" and jitgraph" if os.path.realpath(p.get("filepath") or "") == ours else "")
            blas[who] = {k: p.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                                "threading_layer", "filepath")}
    if torch is not None:
        blas["torch"] = torch_blas(torch)
    env["blas"] = blas
    return env


def fmt_load(load):
    return "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)


def markdown(env):
    """The report's Environment section."""
    L = ["## Environment", "",
         f"* CPU: {env['cpu_model']} ({env.get('cpu_vendor', 'vendor not recorded')}), {env['cpu_count']} cores ({env['usable_cpus']} usable); "
         f"python {env['python']} on {env['platform']}",
         f"* load average (1, 5, 15 min) at start {fmt_load(env['load_average_at_start'])}, "
         f"at end {fmt_load(env.get('load_average_at_end'))}: other processes on the machine, which skew timings",
         "* versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
         "* environment variables: " + (", ".join(f"{k}={v}" for k, v in env["env_vars"].items() if v is not None)
                                        or "none of " + ", ".join(env["env_vars"]) + " set")]
    if env.get("jitgraph_blas"):
        L.append(f"* jitgraph's products: {env['jitgraph_blas']['line']}")
    if env.get("jitgraph_vectors"):
        L.append(f"* jitgraph's loops: {env['jitgraph_vectors']} vectors")
    for who, b in env["blas"].items():
        L.append(f"* BLAS of {who}: " + ", ".join(f"{k} {v}" for k, v in b.items()
                                                  if v is not None and k != "filepath"))
    if env["threadpools"] is None:
        built = env.get("numpy_build_blas")
        L.append("* threadpoolctl not installed: BLAS thread counts not limited or recorded"
                 + (f"; numpy was built against {built['name']} {built['version']} (scipy, which jitgraph's "
                    "matmul calls, may bundle its own)" if built else ""))
    return L
