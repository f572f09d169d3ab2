#!/usr/bin/python3
"""Which BLAS the PyTorch peer of a benchmark runs on, and whether a verdict may rest on it.

Debian's python3-torch reaches BLAS through libblas.so.3, an update-alternatives link: it is
OpenBLAS when libopenblas0-openmp/-pthread is installed (they outrank the rest), but the
reference implementation (netlib, libblas3: /usr/lib/x86_64-linux-gnu/blas/libblas.so.3)
when nothing better is, and a speed ratio against that peer means nothing.  This module
reads /proc/self/maps of a process that imported torch and ran a matmul, and classifies the
BLAS files mapped there by their real paths.  It needs no torch to classify a path.

  peer_blas.py classify PATH...   one line per path: KIND<TAB>PATH (the real path);
                                  KIND is openblas, mkl, blis, atlas, reference or unknown
  peer_blas.py probe              import torch, run a matmul, print
                                    kind=KIND
                                    desc=what was loaded, and the threads
                                  exit 0 if KIND is an optimized BLAS (openblas, mkl, blis),
                                  3 if it is the reference BLAS, 4 otherwise (ATLAS, none,
                                  unknown), 2 if torch cannot be imported.

A torch built with BLAS_INFO=mkl (pip wheels: MKL linked into libtorch_cpu) counts as mkl
whatever else is mapped; otherwise netlib's file, if mapped, decides (libblas.so.3 resolved to it).

RINGTRAIN_PEER_BLAS=PATH[:PATH...] makes `probe` take those paths as what the peer maps,
without importing torch: for testing the check (tests/peer_blas_test.sh).  The benchmarks'
own PyTorch runs report what they really mapped (blas_report(), never the override).
"""
import json
import os
import re
import sys

OPTIMIZED = ("openblas", "mkl", "blis")
EXIT_OK, EXIT_NO_TORCH, EXIT_REFERENCE, EXIT_OTHER = 0, 2, 3, 4


def classify(path):
    """The BLAS implementation a library file is, from its real path."""
    real = os.path.realpath(path)
    base = os.path.basename(real).lower()
    parent = os.path.basename(os.path.dirname(real)).lower()
    if "openblas" in base or "openblas" in parent:
        return "openblas"
    if "mkl" in base or "mkl" in parent:
        return "mkl"
    if "blis" in base or "blis" in parent:
        return "blis"
    if "atlas" in base or "atlas" in parent:
        return "atlas"
    # netlib's reference BLAS: Debian's libblas3 puts it in .../blas/ (libblas.so.3 ->
    # libblas.so.3.11.0); other distributions' plain libblas.so.3 / librefblas
    if base.startswith("librefblas") or (parent == "blas" and base.startswith("libblas.so")):
        return "reference"
    return "unknown"


GPU_BLAS = ("libcublas", "libhipblas", "librocblas")  # a device's BLAS, not the CPU's


def _is_blas_file(path):
    base = os.path.basename(path).lower()
    if base.startswith(GPU_BLAS):
        return False
    return ("blas" in base or "mkl" in base) and ".so" in base


def mapped_blas_libs():
    """Real paths of the BLAS-like shared libraries mapped into this process."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6:
                    continue
                lib = fields[5].strip()
                if lib.startswith("/") and _is_blas_file(lib):
                    real = os.path.realpath(lib)
                    if real not in found:
                        found.append(real)
    except OSError:
        pass
    return found


def torch_config_blas(torch):
    """BLAS_INFO=... from torch.__config__.show(), or ''."""
    try:
        found = re.search(r"\bBLAS_INFO=[^,\s]*", torch.__config__.show())
    except Exception:  # noqa: BLE001 (a build without __config__)
        return ""
    return found.group(0) if found else ""


def _blas_threads(kind, libs):
    """The BLAS library's own thread count, asked through its API; '' if it cannot be asked."""
    import ctypes
    calls = {"openblas": "openblas_get_num_threads", "mkl": "mkl_get_max_threads",
             "blis": "bli_thread_get_num_threads"}
    name = calls.get(kind)
    if not name:
        return ""
    for lib in libs:
        if classify(lib) != kind:
            continue
        try:
            fn = getattr(ctypes.CDLL(lib), name)
            fn.restype = ctypes.c_int
            return str(fn())
        except (OSError, AttributeError):
            continue
    return ""


def report(libs, torch=None, override=False):
    """A dict: kind (the verdict's basis), libs (real path: kind), and a one-line desc."""
    kinds = [classify(lib) for lib in libs]
    config = torch_config_blas(torch) if torch is not None else ""
    cfg = config.lower()
    linked_in = False
    if cfg == "blas_info=mkl":
        kind = "mkl"  # torch calls MKL itself (pip wheels link it into libtorch_cpu)
        linked_in = "mkl" not in kinds
    elif "reference" in kinds:
        kind = "reference"  # libblas.so.3 resolved to netlib's, whatever else is mapped
    elif any(k in OPTIMIZED for k in kinds):
        kind = next(k for k in kinds if k in OPTIMIZED)
    elif not libs and cfg in ("blas_info=open", "blas_info=openblas"):
        kind, linked_in = "openblas", True
    elif kinds:
        kind = kinds[0]  # atlas or unknown
    else:
        kind = "none"
    if linked_in:
        desc = f"{kind}: linked into libtorch" + (f"; also mapped: {', '.join(libs)}" if libs else "")
    else:
        desc = kind + ": " + (", ".join(libs) if libs else "no BLAS library mapped")
    threads = []
    if torch is not None:
        threads.append(f"torch {torch.get_num_threads()}")
    blas_threads = _blas_threads(kind, libs) if not override else ""
    if blas_threads:
        threads.append(f"{kind} {blas_threads}")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var):
            threads.append(f"{var}={os.environ[var]}")
    if threads:
        desc += "; threads: " + ", ".join(threads)
    if config:
        desc += f"; torch config {config}"
    if override:
        desc += " [RINGTRAIN_PEER_BLAS override, torch not probed]"
    return {"kind": kind, "libs": dict(zip(libs, kinds)), "desc": desc}


def blas_report(torch):
    """What this torch process runs on, after a matmul (so a lazily loaded BLAS is mapped)."""
    a = torch.ones(64, 64)
    (a @ a).sum().item()
    return report(mapped_blas_libs(), torch)


def probe():
    override = os.environ.get("RINGTRAIN_PEER_BLAS", "")
    if override:
        rep = report([os.path.realpath(p) for p in override.split(":") if p], override=True)
    else:
        try:
            import torch
        except Exception as err:  # noqa: BLE001 (ImportError, or a broken install)
            print("kind=no-torch")
            print(f"desc={sys.executable} cannot import torch: {err}")
            return EXIT_NO_TORCH
        rep = blas_report(torch)
    print(f"kind={rep['kind']}")
    print(f"desc={rep['desc']}")
    print(f"json={json.dumps(rep, separators=(',', ':'))}")
    if rep["kind"] in OPTIMIZED:
        return EXIT_OK
    return EXIT_REFERENCE if rep["kind"] == "reference" else EXIT_OTHER


def main(argv):
    if len(argv) >= 2 and argv[0] == "classify":
        for path in argv[1:]:
            print(f"{classify(path)}\t{os.path.realpath(path)}")
        return 0
    if argv == ["probe"]:
        return probe()
    print(__doc__, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
