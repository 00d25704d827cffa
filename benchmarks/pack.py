"""Gzip the bulky per-run CSVs of complete runs, so that results/ stays small enough to commit.

    python -m benchmarks.pack [ROOT ...]      (default: results/runs)

`train.csv` (one row of ~25 diagnostics per iteration) and `episodes.csv` (one
row per training episode) are most of a run's bytes; gzip shrinks them about
4x. Each becomes `<name>.gz` (mtime 0, so the same CSV always packs to the same
bytes) and the plain file is removed. Every reader in the suite
(`benchmarks.engine.logger.read_csv_complete_rows`) opens the packed form when the
plain one is absent, so reports are unchanged. Only runs whose summary.json says
`complete` are packed: a running or interrupted run keeps appending to - and
resuming from byte offsets in - its plain CSVs.

`.hydra/hydra.yaml` of a complete run is removed too: Hydra's own runtime
settings (launcher, logging, paths of this machine), 4 KB a run, read by nothing
here. What the run was stays: its config in summary.json and `.hydra/config.yaml`,
its command line in `.hydra/overrides.yaml`.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

from benchmarks.runs import existing_directory, read_summary

PACKED_LOGS = ("train.csv", "episodes.csv")


def pack_run(run_dir: Path) -> int:
    """Pack one complete run's logs; returns the bytes saved (0 when already packed or not complete)."""
    if read_summary(run_dir)["status"] != "complete":
        return 0
    saved = 0
    for name in PACKED_LOGS:
        plain = run_dir / name
        if not plain.exists():
            continue
        data = plain.read_bytes()
        packed = gzip.compress(data, compresslevel=9, mtime=0)
        assert gzip.decompress(packed) == data
        tmp = run_dir / (name + ".gz.tmp")
        tmp.write_bytes(packed)
        tmp.replace(run_dir / (name + ".gz"))
        plain.unlink()
        saved += len(data) - len(packed)
    hydra_runtime = run_dir / ".hydra" / "hydra.yaml"
    if hydra_runtime.exists():
        saved += hydra_runtime.stat().st_size
        hydra_runtime.unlink()
    return saved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="*", type=existing_directory, default=[Path("results/runs")])
    args = parser.parse_args(argv)
    runs = saved = 0
    for root in args.roots:
        for summary in sorted(root.rglob("summary.json")):
            if ".hydra" in summary.parts:
                continue
            run_saved = pack_run(summary.parent)
            runs += run_saved > 0
            saved += run_saved
    print(f"packed {runs} runs, {saved / 1e6:.1f} MB saved")


if __name__ == "__main__":
    main()
