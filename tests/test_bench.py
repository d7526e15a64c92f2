"""`jitgraph bench --quick` on a tiny subset of workloads writes its results files, and
each perf/bench_*.py script runs its workload through the same harness.

Runs in subprocesses: the benchmark sets torch's and BLAS's thread counts, which
must not leak into the test process.  Timings are never asserted.
"""
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from jitgraph.cli import perf_package

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("forward", "backward", "memory", "checkpoint", "conv", "batchnorm", "attention", "budgets", "import")


def run_bench(out, block_torch):
    # sys.modules["torch"] = None makes `import torch` raise ImportError: the
    # machine without torch, even where it is installed
    code = ("import sys\n"
            + ("sys.modules['torch'] = None\n" if block_torch else "")
            + "from jitgraph.cli import main\n"
            f"sys.exit(main(['bench', '--quick', '--only', 'a,d', '--out', {str(out)!r}, '--no-progress']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=checkout_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_results(out)


def checkout_env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def read_results(out):
    with open(out / "results.json") as f:
        report = json.load(f)
    with open(out / "results.md") as f:
        md = f.read()
    return report, md


def check_common(report, md, out):
    assert set(report["results"]) == {"a", "d"}
    for key in ("command", "env", "results", "targets", "repeats"):
        assert key in report
    env = report["env"]
    for key in ("cpu_model", "cpu_count", "threads", "versions", "env_vars", "blas", "threadpools"):
        assert key in env
    assert "OPENBLAS_CORETYPE" in env["env_vars"] and "OPENBLAS_L2_SIZE" in env["env_vars"]
    assert {"numpy", "numba", "scipy", "jitgraph"} <= set(env["versions"])
    # the truth about the host: CPU vendor, and the BLAS jitgraph chose with its kernel
    with open("/proc/cpuinfo") as f:
        vendor = next((line.split(":")[1].strip() for line in f if line.startswith("vendor_id")), None)
    assert vendor is None or env["cpu_vendor"].startswith(vendor + " family ")
    from jitgraph import blas
    chosen = blas.chosen()
    assert env["jitgraph_blas"]["chosen"] == chosen.name and env["jitgraph_blas"]["kernel"] == chosen.kernel
    assert f"* jitgraph's products: {chosen.name} {chosen.version} ({chosen.kernel} kernels" in md
    assert env["cpu_vendor"] in md
    from jitgraph import _target
    assert env["jitgraph_vectors"] == _target.describe() and f"* jitgraph's loops: {_target.describe()}" in md

    a = report["results"]["a"]
    assert {"jitgraph", "numpy"} <= set(a["timing"]["contenders"])
    assert len(a["timing"]["contenders"]["jitgraph"]["samples_s"]) >= 5
    assert "jitgraph/numpy" in a["timing"]["ratios"]
    assert a["agreement"]["numpy"]["ok"]
    d = report["results"]["d"]
    assert {"params", "ops", "build_forward", "build_backward", "total"} <= set(d["median_s"])

    assert [t["workload"] for t in report["targets"]] == ["a", "b", "c", "c", "d", "f", "f", "f", "g", "g", "h", "h", "h", "h", "i", "i", "j", "j", "k"]
    assert "## Targets" in md and "(a) tiny-op chain" in md and "## Environment" in md
    assert (out / "a.png").stat().st_size > 0 and (out / "d.png").stat().st_size > 0


def test_bench_quick_without_torch(tmp_path):
    report, md = run_bench(tmp_path, block_torch=True)
    check_common(report, md, tmp_path)
    a = report["results"]["a"]
    assert "torch" not in a["timing"]["contenders"]
    assert report["env"]["versions"]["torch"] is None
    assert next(t for t in report["targets"] if t["workload"] == "a")["note"] == "torch not available"


def test_bench_quick_uses_torch_exactly_when_installed(tmp_path):
    """Not blocked: PyTorch is a contender if and only if it is importable here."""
    installed = importlib.util.find_spec("torch") is not None      # found without importing it
    report, md = run_bench(tmp_path, block_torch=False)
    check_common(report, md, tmp_path)
    a = report["results"]["a"]
    assert ("torch" in a["timing"]["contenders"]) == installed
    if installed:
        assert "jitgraph/torch" in a["timing"]["ratios"] and a["agreement"]["torch"]["ok"]
        assert "torch" in report["env"]["blas"]
    else:
        assert report["env"]["versions"]["torch"] is None


def test_suite_registers_every_script():
    """`jitgraph bench --only <name>` reaches each perf/bench_*.py workload; the lettered ones are the default."""
    perf_package()
    run = importlib.import_module("jitgraph._perf.run")
    assert [w.key for w in run.WORKLOADS] == list("abcdefghijk") + list(SCRIPTS)
    assert run.DEFAULT == list("abcdefghijk")


def test_bench_quick_models(tmp_path):
    """(h) the ResNet and (i) the char-level GPT: every checkpointing plan bit-identical to
    none (gradients and batch-norm running statistics), torch agreeing when installed,
    the GPT's loss falling in training and checkpointed training bit-identical."""
    code = ("import sys\nfrom jitgraph.cli import main\n"
            f"sys.exit(main(['bench', '--quick', '--only', 'h,i', '--out', {str(tmp_path)!r}, '--no-progress']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=checkout_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, md = read_results(tmp_path)
    torch = importlib.util.find_spec("torch") is not None
    h, i = report["results"]["h"], report["results"]["i"]
    built = [s for s in h["strategies"].values() if "error" not in s]
    assert len(built) >= 2 and all(s["bit_identical"] and s["same_running_stats"] for s in built)
    assert h["strategies"]["sqrt"]["peak_ratio"] < 1.0
    t = i["training"]
    assert t["sqrt_bit_identical"] and t["last_loss"] < t["first_loss"] and len(t["sample"]) == 20
    for res in (h, i):
        assert all(("torch" in e["timing"]["contenders"]) == torch for e in res["by_threads"])
        if torch:
            assert res["agreement"]["torch"]["ok"]
            assert res["torch_compile"].startswith("not run: --quick")       # compiling takes minutes
        assert all("torch.compile" not in e["timing"]["contenders"] for e in res["by_threads"])
    assert "running stats bit-identical" in md and "Sample:" in md


def test_bench_torch_compile_is_a_contender_where_it_can_run(tmp_path):
    """(c) with --torch-compile: torch.compile is timed beside the others exactly when torch
    and a C++ compiler are here, and the report says which, and why not."""
    code = ("import sys\nfrom jitgraph.cli import main\n"
            f"sys.exit(main(['bench', '--quick', '--only', 'c', '--torch-compile', '--out', {str(tmp_path)!r}, "
            "'--no-progress']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=checkout_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, md = read_results(tmp_path)
    c = report["results"]["c"]
    torch = importlib.util.find_spec("torch") is not None
    can = torch and any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))
    for e in c["by_threads"]:
        assert ("torch.compile" in e["timing"]["contenders"]) == can
        assert ("jitgraph/torch.compile" in e["timing"]["ratios"]) == can
    assert c["torch_compile"] == "ran" if can else c["torch_compile"].startswith("not run: ")
    assert f"torch.compile (inductor, compiled in the warm-up): {c['torch_compile']}." in md


def test_bench_quick_gpt_and_python_threads(tmp_path):
    """(g) times the GPT at 1 and 2 threads (those the machine has) with a profile at each;
    (k) runs one ForwardGraph from 1 and 2 Python threads and counts wrong results."""
    code = ("import sys\nfrom jitgraph.cli import main\n"
            f"sys.exit(main(['bench', '--quick', '--only', 'g,k', '--out', {str(tmp_path)!r}, '--no-progress']))\n")
    proc = subprocess.run([sys.executable, "-c", code], env=checkout_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, md = read_results(tmp_path)
    cores = os.cpu_count() or 1
    torch = importlib.util.find_spec("torch") is not None

    g = report["results"]["g"]
    assert [e["threads"] for e in g["by_threads"]] == [n for n in (1, 2) if n <= cores]
    assert g["skipped_threads"] == [n for n in (1, 2) if n > cores]
    for e in g["by_threads"]:
        assert ("torch" in e["timing"]["contenders"]) == torch
        assert e["profile"] and {"op", "phase", "nodes", "seconds", "share"} <= set(e["profile"][0])
    assert g["same_loss_every_thread_count"]
    if torch:
        assert g["agreement"]["torch"]["ok"]
    assert "| op | phase | nodes | 1 thr: time |" in md
    g_targets = [t for t in report["targets"] if t["workload"] == "g"]
    assert [t["what"] for t in g_targets] == ["jitgraph / torch at 1 thread", "jitgraph / torch at 2 threads"]

    k = report["results"]["k"]
    if cores >= 2:
        modes = k["contenders"]["jitgraph"]["modes"]
        assert set(modes) == {"1 thread", "2 threads"}
        assert modes["1 thread"]["wrong"] == 0 and modes["1 thread"]["errors"] == 0   # serial runs are always right
        assert modes["2 threads"]["calls_checked"] == 2 * modes["1 thread"]["calls_checked"]
    else:
        assert "skipped" in k
    assert next(t for t in report["targets"] if t["workload"] == "k")["at_least"]


@pytest.mark.parametrize("name", SCRIPTS)
def test_perf_script_quick(tmp_path, name):
    """python perf/bench_<name>.py --quick, from the repository root: its one workload,
    timed and reported by the harness (one thread: a smoke test, not a measurement)."""
    cmd = [sys.executable, os.path.join("perf", f"bench_{name}.py"), "--quick", "--no-torch", "--no-progress",
           "--threads", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report, md = read_results(tmp_path)
    assert list(report["results"]) == [name] and report["targets"] == []
    words = report["command"].split()
    while words and "=" in words[0]:            # the OpenBLAS variables in force, if the machine sets them
        words.pop(0)
    assert " ".join(words).startswith(f"python perf/bench_{name}.py --quick")
    res = report["results"][name]
    assert f"## {res['title']}" in md and "## Environment" in md
    assert report["env"]["threads"] == 1


def test_compile_time_children_report_every_phase():
    """Workload (f)'s two programs, run warm on this checkout's cache: the MLP reports
    its phases (which add up to its first gradient), the demo its first output."""
    compile_time = importlib.import_module(perf_package().__name__ + ".compile_time")
    mlp = compile_time.mlp_process(None, 1)
    assert set(compile_time.PHASES) <= set(mlp)
    assert abs(sum(mlp[p] for p in compile_time.PHASES) - mlp["first_gradient_s"]) < 0.05
    assert 0 < mlp["first_gradient_s"] < mlp["wall_s"]
    demo = compile_time.demo_process(None, 1, 1)
    assert 0 < demo["first_output_s"] < demo["wall_s"]
