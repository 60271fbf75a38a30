"""Which OpenBLAS kernels the PyTorch peer should run, decided from facts passed in.

Debian's OpenBLAS 0.3.21 does not recognise some newer CPUs (Sapphire Rapids) and falls back
to its SSE3 "Prescott" kernels, 4x slower than the CPU allows. Only then, and only when
OPENBLAS_CORETYPE is not set already, does the peer re-execute itself with the best core type
the CPU's own flags support; a CPU that OpenBLAS recognises keeps its detection. The decision
is a pure function so that it can be tested for CPUs other than the one running the tests.
"""

# OpenBLAS's core types by the CPU flags each needs, best first.
CORES = (("SKYLAKEX", {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}),
         ("HASWELL", {"avx2", "fma"}), ("SANDYBRIDGE", {"avx"}))
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
    if chosen:
        return None, f"chosen from the CPU's flags (OpenBLAS detected {chosen})"
    if "OPENBLAS_CORETYPE" in environ:
        return None, "OPENBLAS_CORETYPE from the environment"
    if detected.lower() not in FALLBACK_CORES:
        return None, "detected by OpenBLAS"
    best = next((name for name, needs in CORES if needs <= flags), None)
    if best is None:
        return None, "detected by OpenBLAS"
    return best, f"chosen from the CPU's flags (OpenBLAS detected {detected})"
