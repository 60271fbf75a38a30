"""The PyTorch peer's choice of OpenBLAS kernels, for CPUs other than the one running it.

Flags are abridged from /proc/cpuinfo of the machines named; what matters is which of the
vector extensions each has. Run: python3 tools/test_openblas_core.py (ctest: openblas_core).
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas_core  # noqa: E402

SAPPHIRE_RAPIDS = ("fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512dq "
                   "avx512cd avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile amx_int8")
ZEN3 = "fpu sse sse2 ssse3 sse4_1 sse4_2 sse4a avx f16c fma avx2 bmi2 sha_ni vaes"
HASWELL = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma avx2"
SANDY_BRIDGE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx"
NEHALEM = "fpu sse sse2 ssse3 sse4_1 sse4_2"


def flags(text):
    return openblas_core.cpu_flags(f"processor\t: 0\nflags\t\t: {text}\nbugs\t\t: none\n")


class Decide(unittest.TestCase):
    def test_sapphire_rapids_misdetected_as_prescott_gets_skylakex(self):
        force, source = openblas_core.decide("Prescott", flags(SAPPHIRE_RAPIDS), {})
        self.assertEqual(force, "SKYLAKEX")
        self.assertEqual(source, "chosen from the CPU's flags (OpenBLAS detected Prescott)")

    def test_a_recognised_cpu_keeps_its_detection(self):
        for detected, cpu in (("Zen", ZEN3), ("SkylakeX", SAPPHIRE_RAPIDS), ("Haswell", HASWELL)):
            with self.subTest(detected=detected):
                self.assertEqual(openblas_core.decide(detected, flags(cpu), {}),
                                 (None, "detected by OpenBLAS"))

    def test_never_forces_an_instruction_set_the_cpu_lacks(self):
        # The failure this replaced: SKYLAKEX forced on an AVX2-only AMD gave SIGILL.
        for cpu, want in ((ZEN3, "HASWELL"), (HASWELL, "HASWELL"), (SANDY_BRIDGE, "SANDYBRIDGE")):
            with self.subTest(want=want):
                force, _ = openblas_core.decide("Prescott", flags(cpu), {})
                self.assertEqual(force, want)
                needs = dict(openblas_core.CORES)[force]
                self.assertLessEqual(needs, flags(cpu))

    def test_a_cpu_without_avx_keeps_the_sse_kernels(self):
        self.assertEqual(openblas_core.decide("Nehalem", flags(NEHALEM), {}),
                         (None, "detected by OpenBLAS"))
        self.assertEqual(openblas_core.decide("Prescott", set(), {}),
                         (None, "detected by OpenBLAS"))

    def test_the_environment_wins(self):
        env = {"OPENBLAS_CORETYPE": "SANDYBRIDGE"}
        self.assertEqual(openblas_core.decide("Prescott", flags(SAPPHIRE_RAPIDS), env),
                         (None, "OPENBLAS_CORETYPE from the environment"))

    def test_the_re_executed_process_reports_the_choice_and_does_not_loop(self):
        env = {"OPENBLAS_CORETYPE": "SKYLAKEX", "BOTTLE_OPENBLAS_CHOSEN": "Prescott"}
        self.assertEqual(openblas_core.decide("SkylakeX", flags(SAPPHIRE_RAPIDS), env),
                         (None, "chosen from the CPU's flags (OpenBLAS detected Prescott)"))

    def test_a_pinned_weaker_core_is_kept_outside_benches(self):
        env = {"OPENBLAS_CORETYPE": "HASWELL"}
        self.assertEqual(openblas_core.decide("Haswell", flags(SAPPHIRE_RAPIDS), env),
                         (None, "OPENBLAS_CORETYPE from the environment"))

    def test_a_bench_runs_the_best_core_over_a_weaker_pinned_one(self):
        for pinned in ("Haswell", "ZEN", "SANDYBRIDGE"):
            with self.subTest(pinned=pinned):
                env = {"OPENBLAS_CORETYPE": pinned, "BOTTLE_OPENBLAS_BEST": "1"}
                self.assertEqual(
                    openblas_core.decide("Haswell", flags(SAPPHIRE_RAPIDS), env),
                    ("SKYLAKEX",
                     f"chosen from the CPU's flags over the pinned OPENBLAS_CORETYPE={pinned}"))

    def test_a_bench_keeps_a_pinned_core_as_good_or_unknown(self):
        for pinned, cpu in (("SKYLAKEX", SAPPHIRE_RAPIDS), ("HASWELL", ZEN3),
                            ("COOPERLAKE", SAPPHIRE_RAPIDS), ("NEOVERSEN1", SAPPHIRE_RAPIDS)):
            with self.subTest(pinned=pinned):
                env = {"OPENBLAS_CORETYPE": pinned, "BOTTLE_OPENBLAS_BEST": "1"}
                self.assertEqual(openblas_core.decide("Haswell", flags(cpu), env),
                                 (None, "OPENBLAS_CORETYPE from the environment"))

    def test_the_re_executed_bench_reports_the_pinned_core(self):
        env = {"OPENBLAS_CORETYPE": "SKYLAKEX", "BOTTLE_OPENBLAS_CHOSEN": "Haswell",
               "BOTTLE_OPENBLAS_PINNED": "Haswell", "BOTTLE_OPENBLAS_BEST": "1"}
        self.assertEqual(openblas_core.decide("SkylakeX", flags(SAPPHIRE_RAPIDS), env),
                         (None, "chosen from the CPU's flags over the pinned "
                                "OPENBLAS_CORETYPE=Haswell"))
        self.assertEqual(openblas_core.pinned_core(env), "Haswell")

    def test_cpu_flags_of_this_machine_parse(self):
        with open("/proc/cpuinfo") as f:
            mine = openblas_core.cpu_flags(f.read())
        self.assertIn("sse2", mine)  # every x86-64 CPU


if __name__ == "__main__":
    unittest.main()
