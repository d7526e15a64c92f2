"""Where jitgraph's compiled code is cached -- a folder keyed on everything it
depends on, so a stale cache can never be hit.

Numba checks a cached function against its own source file only: edit a kernel
that a runner in another file calls, upgrade jitgraph or Numba, or turn bounds
checking on, and Numba would load the old machine code.  So jitgraph's functions
get a cache locator of their own, whose folder is named by a hash of every source
file of the package, the Numba, llvmlite and Python versions, the compile flags
that change the code and the CPU it is compiled for.  Any change gives a new, empty
folder; older folders of the same root are pruned.  An install compiles the common
kernels into the package folder's ``.jitcache`` (setup.py), which is then this root.

The root is ``$NUMBA_CACHE_DIR/jitgraph`` if that is set, else ``.jitcache`` in the
package folder, else (a read-only install) ``$XDG_CACHE_HOME/jitgraph`` or
``~/.cache/jitgraph``.  This module must be imported before any jitted function
is defined (``jitgraph/__init__.py`` does it first).
"""
import hashlib
import os
import shutil
import sys
import tempfile

import llvmlite
import numba
from llvmlite import binding
from numba.core import caching, config
from numba.core.codegen import get_host_cpu_features

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
KEEP_FOLDERS = 3          # newest cache folders kept per root (older builds are deleted)


def _source_files():
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def target_cpu() -> tuple:
    """The CPU the code is compiled for: its name and features as Numba's code generator will
    see them (the user's NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, or _target's choice, else the
    host's)."""
    name = getattr(config, "CPU_NAME", None) or binding.get_host_cpu_name()
    features = getattr(config, "CPU_FEATURES", None) or get_host_cpu_features()
    return str(name), str(features)


def source_key() -> str:
    """A hash of the package's sources and of what else decides the machine code: Numba's,
    llvmlite's and Python's versions, the compile flags and the CPU -- so a cache compiled
    elsewhere (a wheel built on another machine) is never even looked at here."""
    h = hashlib.sha256()
    for path in _source_files():
        h.update(os.path.relpath(path, PACKAGE_DIR).encode())
        with open(path, "rb") as f:
            h.update(f.read())
    flags = tuple(getattr(config, name, None) for name in ("BOUNDSCHECK", "OPT", "FASTMATH"))
    h.update(repr((numba.__version__, llvmlite.__version__, sys.version_info[:3], flags, target_cpu())).encode())
    return h.hexdigest()[:16]


def _writable(path):
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def user_root() -> str:
    """jitgraph's folder in the user's cache ($XDG_CACHE_HOME or ~/.cache)."""
    user = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(user, "jitgraph")


def cache_root() -> str:
    candidates = []
    if os.environ.get("NUMBA_CACHE_DIR"):
        candidates.append(os.path.join(os.environ["NUMBA_CACHE_DIR"], "jitgraph"))
    candidates.append(os.path.join(PACKAGE_DIR, ".jitcache"))
    candidates.append(user_root())
    for path in candidates:
        if _writable(path):
            return path
    return os.path.join(tempfile.gettempdir(), f"jitgraph-cache-{os.getuid() if hasattr(os, 'getuid') else 0}")


def prune(root, keep):
    """Delete all but the ``KEEP_FOLDERS`` most recently used key folders under root."""
    try:
        folders = [os.path.join(root, d) for d in os.listdir(root) if d.startswith("k-")]
    except OSError:
        return
    folders = [f for f in folders if f != keep]
    folders.sort(key=lambda f: os.path.getmtime(f), reverse=True)
    for old in folders[KEEP_FOLDERS - 1:]:
        shutil.rmtree(old, ignore_errors=True)


KEY = source_key()
ROOT = cache_root()
CACHE_DIR = os.path.join(ROOT, "k-" + KEY)
SHIPPED_DIR = os.path.join(PACKAGE_DIR, ".jitcache", "k-" + KEY)    # compiled when the package was installed
INSTALLED = "installed"     # the file that says so (warmup.precompile): a clone's own cache has none


def copy_folder(src: str, dst: str) -> bool:
    """Copy folder ``src`` to ``dst`` whole or not at all (another process may be doing the
    same: the first to finish wins); whether ``dst`` is there now."""
    part = dst + f".part-{os.getpid()}"
    try:
        shutil.copytree(src, part)
        os.replace(part, dst)
    except OSError:
        shutil.rmtree(part, ignore_errors=True)     # another process got there first, or no room
    return os.path.isdir(dst)


def _adopt_shipped() -> None:
    """An install compiled this build into the package folder (setup.py); when the cache lives
    elsewhere (that folder is read-only, or NUMBA_CACHE_DIR points away) its first use starts
    from a copy of what the install compiled instead of from nothing."""
    if CACHE_DIR == SHIPPED_DIR or os.path.isdir(CACHE_DIR) or \
            not os.path.isfile(os.path.join(SHIPPED_DIR, INSTALLED)):
        return
    copy_folder(SHIPPED_DIR, CACHE_DIR)             # or compile, if that fails


class JitgraphCacheLocator(caching._CacheLocator):
    """Numba cache locator for functions defined in jitgraph's own files."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file            # read by Numba when it refuses to cache a function
        self._lineno = py_func.__code__.co_firstlineno
        rel = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), PACKAGE_DIR)
        self._cache_path = os.path.join(CACHE_DIR, rel.replace(os.sep, "_"))

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return KEY                     # the folder already names the sources; nothing else to check

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        path = os.path.abspath(py_file)
        if not path.startswith(PACKAGE_DIR + os.sep):
            return None                # someone else's function: Numba's own locators decide
        self = cls(py_func, py_file)
        try:
            self.ensure_cache_path()
        except OSError:
            return None
        return self


def install() -> None:
    """Put the locator first for every kind of cached function (njit and cfunc)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")   # renamed in Numba 0.61
    classes = impl._locator_classes
    if JitgraphCacheLocator not in classes:
        classes.insert(0, JitgraphCacheLocator)
    chosen = getattr(config, "CACHE_LOCATOR_CLASSES", "")       # NUMBA_CACHE_LOCATOR_CLASSES overrides the list
    if chosen and "JitgraphCacheLocator" not in chosen:
        setattr(config, "CACHE_LOCATOR_CLASSES", "jitgraph._cache.JitgraphCacheLocator," + chosen)
    _adopt_shipped()
    first = not os.path.isdir(CACHE_DIR)
    os.makedirs(CACHE_DIR, exist_ok=True)
    os.utime(CACHE_DIR)                # "recently used", for pruning
    prune(ROOT, CACHE_DIR)
    if first and os.environ.get("JITGRAPH_QUIET", "").strip() in ("", "0"):
        print("jitgraph: first use of this build -- what a graph uses compiles on first use "
              f"(tens of seconds; cached in {CACHE_DIR}; `jitgraph warmup` compiles ahead of time)",
              file=sys.stderr, flush=True)


install()
