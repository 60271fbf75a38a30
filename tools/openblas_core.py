"""Which OpenBLAS kernels the PyTorch peer should run, decided from facts passed in.

Debian's OpenBLAS 0.3.21 does not recognise some newer CPUs (Sapphire Rapids) and falls back
to its SSE3 "Prescott" kernels, 4x slower than the CPU allows. Only then, and only when
OPENBLAS_CORETYPE is not set already, does the peer re-execute itself with the best core type
the CPU's own flags support; a CPU that OpenBLAS recognises keeps its detection. The decision
is a pure function so that it can be tested for CPUs other than the one running the tests.

Benches only (`bench step` sets BOTTLE_OPENBLAS_BEST=1; tests and CI never do): when the
environment pins OPENBLAS_CORETYPE to a weaker core than the CPU's flags support (an image that
pins HASWELL on an AVX-512 CPU), the peer re-executes itself with the best one, so that the
ratio a bench prints is against PyTorch at its best. It reports both the pinned core and the
one it ran.
"""

# OpenBLAS's core types by the CPU flags each needs, best first.
CORES = (("SKYLAKEX", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}),
         ("HASWELL", {"avx2", "fma"}), ("SANDYBRIDGE", {"avx"}))
# Pinned names that run one of those cores' kernels (OpenBLAS's Zen cores are its Haswell ones).
ALIASES = {"ZEN": "HASWELL", "SKYLAKE": "HASWELL", "COOPERLAKE": "SKYLAKEX",
           "SAPPHIRERAPIDS": "SKYLAKEX"}
# What OpenBLAS names an x86-64 CPU it does not recognise: its SSE-only kernels.
FALLBACK_CORES = {"prescott", "core2", "penryn", "dunnington", "nehalem", "atom", "katmai",
                  "coppermine", "northwood", "banias", "unknown"}


def cpu_flags(cpuinfo_text):
    """The flags of the first processor in /proc/cpuinfo's text (an empty set if none)."""
    for line in cpuinfo_text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def decide(detected, flags, environ):
    """(core to force or None, how the kernels were chosen).

    detected: the core OpenBLAS reports (openblas_get_corename); flags: the CPU's flags;
    environ: the process environment. A core to force means: re-execute with
    OPENBLAS_CORETYPE set to it.
    """
    chosen = environ.get("BOTTLE_OPENBLAS_CHOSEN")
    pinned = environ.get("BOTTLE_OPENBLAS_PINNED")
    if chosen and pinned:
        return None, f"chosen from the CPU's flags over the pinned OPENBLAS_CORETYPE={pinned}"
    if chosen:
        return None, f"chosen from the CPU's flags (OpenBLAS detected {chosen})"
    if "OPENBLAS_CORETYPE" in environ:
        pinned = environ["OPENBLAS_CORETYPE"]
        if environ.get("BOTTLE_OPENBLAS_BEST") == "1":
            best = best_core(flags)
            if best is not None and rank(best) < rank(pinned):
                return best, f"chosen from the CPU's flags over the pinned OPENBLAS_CORETYPE={pinned}"
        return None, "OPENBLAS_CORETYPE from the environment"
    if detected.lower() not in FALLBACK_CORES:
        return None, "detected by OpenBLAS"
    best = best_core(flags)
    if best is None:
        return None, "detected by OpenBLAS"
    return best, f"chosen from the CPU's flags (OpenBLAS detected {detected})"


def best_core(flags):
    """The best of CORES whose instructions the CPU has, or None."""
    return next((name for name, needs in CORES if needs <= flags), None)


def rank(core):
    """A core's place in CORES (0 the best); a name it cannot place ranks before all, so that
    a pinned core it does not know is never overridden."""
    name = ALIASES.get(core.upper(), core.upper())
    names = [n for n, _ in CORES]
    return names.index(name) if name in names else -1


def pinned_core(environ):
    """The OPENBLAS_CORETYPE the environment pinned before the peer chose its own, or None."""
    return environ.get("BOTTLE_OPENBLAS_PINNED") or environ.get("OPENBLAS_CORETYPE")
