"""Which float kernels this process computes with: the same run on two x86-64 CPUs gives the same numbers
only if both use the same kernels.

torch, MKL (torch's BLAS), oneDNN, OpenBLAS (numpy's BLAS) and numpy's own loops each pick, when they load,
the widest instruction set the CPU offers: AVX-512 on one machine, AVX2 on another. The kernels sum in a
different order, so the last bits differ from the first update on, and a learning curve diverges after a
few thousand steps. Two modes, chosen by the environment variable SUITE_NUMERICS:

    portable  every library pinned to kernels that any x86-64 CPU with AVX2 and FMA runs alike
              (the default; this module sets the variables below before numpy and torch load)
    native    each library picks the widest kernels its CPU has

    SUITE_NUMERICS=native python run.py algo=ppo env=CartPole

Nothing here imports numpy or torch: the package's __init__ calls `pin_kernels()` before any module that
does. A variable the user already set is left as it is; `kernel_record()` (in every summary.json) says what
the libraries actually chose, and benchmarks/reproduce.py reruns a stored run in the mode it was made in.
"""

from __future__ import annotations

import os
import sys

MODE_VARIABLE = "SUITE_NUMERICS"
PINNED_VARIABLE = "SUITE_NUMERICS_PINNED"  # which of the variables below the suite set (inherited by children)
MODES = ("portable", "native")
DEFAULT_MODE = "portable"

# Each library's own switch, read when the library loads (numpy, OpenBLAS) or first computes (torch, MKL).
PORTABLE_KERNELS = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's vectorised ATen kernels (tanh, exp, sums, Adam's foreach ops)
    "MKL_CBWR": "COMPATIBLE",  # MKL's gemm behind torch's nn.Linear: its only branch that is the same on AMD CPUs
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN kernels torch uses for some ops
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's OpenBLAS: the AVX2 gemm kernels, on any CPU
    "NPY_ENABLE_CPU_FEATURES": "X86_V3",  # numpy's own SIMD loops: up to AVX2/FMA, never AVX-512
}
# A CPU without these cannot run the pinned kernels (numpy refuses to start if asked for X86_V3 there).
REQUIRED_CPU_FLAGS = ("avx2", "fma")
SET_HERE: list[str] = []  # the variables pin_kernels() set (not the user's own)


def requested_mode() -> str:
    mode = os.environ.get(MODE_VARIABLE, DEFAULT_MODE).strip().lower() or DEFAULT_MODE
    if mode not in MODES:
        print(f"{MODE_VARIABLE}={os.environ[MODE_VARIABLE]!r} is not a numerics mode: use one of {', '.join(MODES)}",
              file=sys.stderr)
        sys.exit(2)
    return mode


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return set(next(line for line in cpuinfo if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def pin_kernels() -> str:
    """Set the portable variables (unless the user set them) when portable mode is asked for and possible.
    Returns the mode this process runs in: 'portable', 'native', or 'native (no AVX2/FMA)'."""
    mode = requested_mode()
    # Pins inherited from a parent process of this suite (not the user's own) count as this module's.
    SET_HERE.extend(name for name in os.environ.pop(PINNED_VARIABLE, "").split(",") if name in PORTABLE_KERNELS)
    if mode == "native" or not set(REQUIRED_CPU_FLAGS) <= cpu_flags():
        for variable in SET_HERE:
            os.environ.pop(variable, None)
        SET_HERE.clear()
        return mode if mode == "native" else "native (no AVX2/FMA)"
    loaded = [name for name in ("numpy", "torch") if name in sys.modules]
    # too late for the load-time switches, unless they are already in os.environ (a launcher's worker, such as
    # joblib's, imports numpy first but inherits its parent's pins); the run's record shows what the libraries chose
    if loaded and any(variable not in os.environ for variable in PORTABLE_KERNELS):
        print(f"numerics: {' and '.join(loaded)} loaded before the kernels were pinned; import benchmarks first",
              file=sys.stderr)
    for variable, value in PORTABLE_KERNELS.items():
        if variable not in os.environ:
            os.environ[variable] = value
            SET_HERE.append(variable)
    os.environ[PINNED_VARIABLE] = ",".join(SET_HERE)  # so child processes know which pins are the suite's
    return mode


def environment_for(mode: str) -> dict[str, str]:
    """This process's environment for a child process that should run in `mode` (the pins this module set
    removed, so a native child picks its own kernels)."""
    environment = {k: v for k, v in os.environ.items() if k not in SET_HERE and k != PINNED_VARIABLE}
    environment[MODE_VARIABLE] = mode
    return environment


def base_mode(mode: str) -> str:
    """'portable' or 'native' ('native (no AVX2/FMA)' is native)."""
    return "portable" if mode == "portable" else "native"


def openblas_core() -> str | None:
    """The kernel set numpy's OpenBLAS chose (Haswell, SkylakeX, Zen, ...), if numpy's build says."""
    import ctypes

    name = openblas_function(("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                              "openblas_get_corename"), ctypes.c_char_p)
    return None if name is None else name.decode()


def openblas_threads() -> int | None:
    """How many threads numpy's OpenBLAS computes with, if numpy's build says."""
    import ctypes

    return openblas_function(("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
                              "openblas_get_num_threads"), ctypes.c_int)


def openblas_function(symbols: tuple[str, ...], result_type):
    """Call the first of `symbols` numpy's bundled OpenBLAS exports (no arguments); None if it exports none."""
    import ctypes
    import glob

    import numpy as np

    libraries = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for path in libraries:
        library = ctypes.CDLL(path)
        for symbol in symbols:
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = result_type
                return function()
    return None


def kernel_record() -> dict:
    """What this process asked for and what each library chose: summary.json's `machine.numerics`."""
    import numpy as np
    import torch

    return {
        "mode": MODE,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "numpy_simd": np.show_config(mode="dicts").get("SIMD Extensions", {}).get("found", []),
        "openblas_core": openblas_core(),
        "variables": {variable: os.environ.get(variable) for variable in PORTABLE_KERNELS},
    }


def one_blas_thread() -> None:
    """numpy's OpenBLAS on one thread (as torch is, torch_threads: 1), in either mode: a run is one core and runs
    are parallelised by processes. Its default, a thread per core, lets two training processes on two cores
    oversubscribe them: a numpy minibatch step of PPO measured 5x slower that way under load. Threading splits
    a product's output, not its sums, so the numbers are the same (checked on CartPole and HalfCheetah runs)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


one_blas_thread()
MODE = pin_kernels()
