"""The benchmark suite: the training engine, the analysis of stored runs, the speed tools.

Importing it pins the float kernels numpy and torch will use (benchmarks/numerics.py), so it must come
before either library loads; run.py and every `python -m benchmarks.<tool>` import it first.
"""

from benchmarks import numerics  # noqa: F401  (pins the kernels on import)
