"""Store the logs of a suite's complete runs in Parquet tables, so that results/ stays small enough to commit.

    python -m benchmarks.pack [SUITE ...]            (default: every suite under results/runs)
    python -m benchmarks.pack --unpack SUITE ...     (the CSVs back into each run's directory)
    python -m benchmarks.pack --repack [SUITE ...]   (every packed table written again in this version's form)

A run writes `train.csv` (one row of ~25 diagnostics per iteration, among them
the iteration's episode statistics), `eval.csv` and `episodes.csv` (one row per
training episode). Packing a suite moves the three logs of each of its complete
runs into `SUITE/logs/train.parquet`, `eval.parquet` and `episodes.parquet`:
one table per log with a `run` column (the run's directory below SUITE),
zstd-compressed, floats stored byte-stream-split. What is stored is what pandas
reads from the CSV (its columns, their order and dtypes, each value bit for
bit; an empty cell of a text column comes back as None), checked by reading
the file back before any CSV is removed, with two exceptions, both for size:
- episodes.csv keeps each run's last 100 episodes (LAST_EPISODES, CleanRL's
  last-100 metric and all any reader of stored runs reads of it); the earlier episodes
  are in train.csv only as each iteration's count, mean and std of returns and
  mean length. A 1M-step MuJoCo run finishes up to ~14,000 episodes, and their
  returns are full-precision doubles that do not compress: storing each of
  them took 60% of a packed suite's logs. `benchmarks.reproduce` compares a rerun's
  last rows with them (and every iteration's statistics in train.csv).
- the timing columns (wall_time, sps, rollout_time, update_time: seconds
  measured on a machine the run shared, which `benchmarks.reproduce` does not
  compare) are stored as float32, the precision every reader reads them at,
  plain CSV or packed.
Every reader in the suite (`benchmarks.engine.logger.read_csv_complete_rows`)
falls back to the nearest `logs/` folder above a run when its CSVs are absent,
so reports, claims, the regression check and `benchmarks.reproduce` read packed
and plain runs alike.

Only runs whose summary.json says `complete` are packed: a running or
interrupted run keeps appending to - and resuming from byte offsets in - its
plain CSVs. summary.json stays in each run's directory (it is how runs are
found and what a suite skips), rewritten on one line: the same JSON, read
alike, about 30% smaller than the trainer's indented file. A run packed earlier and trained again keeps
its new CSVs, which readers prefer; packing again replaces its stored rows.
Runs packed by an earlier version of this command as `<name>.csv.gz` are read
and moved into the suite's file alike. `--unpack` writes every run's CSVs back
(the same numbers, read back exactly) and removes the suite's `logs/`: for
editing logs by hand, or copying single runs out of a suite (episodes.csv then
holds the last 100 episodes it kept).

Every `.hydra/hydra.yaml` under the suite is removed too: Hydra's own runtime
settings (launcher, logging, paths of this machine), 4 KB a job, read by nothing
here. What a run was stays: its config in summary.json and `.hydra/config.yaml`,
its command line in `.hydra/overrides.yaml`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.engine.logger import at_timing_precision, read_csv_complete_rows, timing_columns, write_bytes_atomic
from benchmarks.arguments import existing_directory
from benchmarks.runs import LAST_EPISODES, read_summary

PACKED_LOGS = ("train.csv", "eval.csv", "episodes.csv")
SUITE_LOGS = "logs"  # SUITE/logs/<log>.parquet, e.g. logs/train.parquet for the runs' train.csv
# In the file's schema: {"columns": [[[column, dtype], ...], ...], "runs": {run: index into columns}}: what each
# stored CSV held (runs of one preset share one list).
METADATA_KEY = b"benchmarks.pack"


def packed_file(suite_dir: Path, name: str) -> Path:
    return suite_dir / SUITE_LOGS / name.replace(".csv", ".parquet")


def complete_runs(suite_dir: Path) -> list[Path]:
    return sorted(summary.parent for summary in suite_dir.rglob("summary.json")
                  if ".hydra" not in summary.parts and read_summary(summary.parent)["status"] == "complete")


def unfinished_runs(suite_dir: Path) -> list[Path]:
    """Run directories under suite_dir that are not complete (training, paused, interrupted, failed, or a first
    checkpoint not yet followed by a summary): packing leaves them as they are."""
    marks = ("summary.json", "checkpoint.pt", "train.csv", "train.csv.gz")
    found = {path.parent for mark in marks for path in suite_dir.rglob(mark) if ".hydra" not in path.parts}
    return sorted(found - set(complete_runs(suite_dir)))


def unpacked_files(run_dir: Path, name: str) -> list[Path]:
    """The files holding one log of a run outside the suite's Parquet file: plain CSV and/or its gzip."""
    return [path for path in (run_dir / name, run_dir / (name + ".gz")) if path.exists()]


def packed_suites_around(suite_dir: Path) -> list[Path]:
    """Packed suites that hold suite_dir or that it holds: a run's rows belong to one suite only."""
    above = [parent for parent in suite_dir.absolute().parents if packed_file(parent, PACKED_LOGS[0]).is_file()]
    below = [path.parent.parent for path in suite_dir.rglob(packed_file(Path(), PACKED_LOGS[0]).as_posix())
             if path.parent.parent != suite_dir]
    return above + below


def pack_suite(suite_dir: Path, repack: bool = False) -> tuple[int, int]:
    """Move the logs of every complete run under suite_dir into suite_dir/logs/<log>.parquet; the rows of runs no
    longer complete there (deleted, or started afresh) leave the table; repack: every table is written again (in
    this version's form) whether or not it changed. Returns (runs packed now, bytes saved).
    ValueError, naming the problem, for a directory that is no suite (a run's) or lies in or around a packed one."""
    if (suite_dir / "summary.json").exists():
        raise ValueError(f"{suite_dir} is a run's directory: pack the suite that holds it")
    if nested := packed_suites_around(suite_dir):
        raise ValueError(f"{suite_dir}: {nested[0]} is a packed suite in or around it; pack that one")
    saved = 0
    packed_runs: set[str] = set()
    complete = {run_dir.relative_to(suite_dir).as_posix(): run_dir for run_dir in complete_runs(suite_dir)}
    gathered = {}  # log -> (every complete run's frame, the files it moves in, how many runs its table held)
    for name in PACKED_LOGS:
        target = packed_file(suite_dir, name)
        stored = dict(read_suite_log(target)) if target.exists() else {}
        logs = {run: frame for run, frame in stored.items() if run in complete}
        moved: list[Path] = []
        for run, run_dir in complete.items():
            files = unpacked_files(run_dir, name)
            if files:
                try:
                    logs[run] = read_csv_complete_rows(run_dir / name)  # the plain file when both exist
                except Exception as error:  # an empty or damaged file: named, and nothing of this log is moved
                    raise ValueError(f"{run_dir / name}: cannot be read ({type(error).__name__}: {error})") from None
                moved += files
                packed_runs.add(run)
        gathered[name] = (logs, moved, len(stored))
    # The three tables change together or not at all: each is written to a temp file and read back, and only when
    # all three check are they renamed into place and their CSVs removed.
    written: list[tuple[Path, Path, list[Path]]] = []  # (temp file or None for a table left empty, target, moved)
    try:
        for name in PACKED_LOGS:
            logs, moved, stored_runs = gathered[name]
            target = packed_file(suite_dir, name)
            if not moved and len(logs) == stored_runs and not repack:
                continue
            if not logs:
                written.append((None, target, moved))
                continue
            written.append((write_suite_log(target, logs), target, moved))
    except BaseException:
        for tmp, _, _ in written:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        raise
    for tmp, target, moved in written:
        before = (target.stat().st_size if target.exists() else 0) + sum(path.stat().st_size for path in moved)
        if tmp is None:
            target.unlink(missing_ok=True)
        else:
            tmp.replace(target)
        for path in moved:
            path.unlink()
        saved += before - (target.stat().st_size if target.exists() else 0)
    saved += sum(compact_summary(run_dir) for run_dir in complete.values())
    for hydra_runtime in suite_dir.rglob(".hydra/hydra.yaml"):
        saved += hydra_runtime.stat().st_size
        hydra_runtime.unlink()
    return len(packed_runs), saved


def compact_summary(run_dir: Path) -> int:
    """A complete run's summary.json without indentation (json.loads reads the same mapping: keys in their order,
    every number as it was); returns the bytes saved."""
    path = run_dir / "summary.json"
    text = path.read_bytes()
    compact = json.dumps(json.loads(text), separators=(",", ":")).encode()
    if compact == text:
        return 0
    write_bytes_atomic(path, compact)
    return len(text) - len(compact)


def write_suite_log(target: Path, logs: dict) -> Path:
    """One Parquet table of every run's frame of one log, written to a temp file beside target and read back and
    compared frame by frame with what was given (exactly: columns, dtypes, every value); returns the temp file, for
    the caller to rename into place (RuntimeError, the temp file removed, if it does not read back). An episodes
    table keeps each run's last LAST_EPISODES rows."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    runs = sorted(logs)
    if target.name == "episodes.parquet":  # each run's last episodes only (the module's docstring says why)
        logs = {run: frame.tail(LAST_EPISODES).reset_index(drop=True) for run, frame in logs.items()}
    kinds: dict[str, set] = {}
    for run in runs:
        if "run" in logs[run].columns:
            raise ValueError(f"{target.parent.parent / run}: its {target.stem}.csv has a column named 'run', the "
                             f"name the packed table gives its runs; that log was not packed")
        for column, values in logs[run].items():
            kinds.setdefault(column, set())
            if values.notna().any():  # an empty or all-missing column is neither text nor numbers
                kinds[column].add("text" if values.dtype == object or pd.api.types.is_string_dtype(values.dtype)
                                  else "number")
    mixed = sorted(column for column, kind in kinds.items() if len(kind) > 1)
    if mixed:
        raise ValueError(f"{target.parent.parent}: column {mixed[0]!r} of {target.stem}.csv holds text in one run and "
                         f"numbers in another; that log was not packed (its runs keep their CSVs)")
    rows = [logs[run].assign(run=run) for run in runs if len(logs[run])]
    everything = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame({"run": pd.Series(dtype=str)})
    everything = everything.reindex(columns=["run", *kinds])
    for column in timing_columns(everything):  # read at float32 precision (read_csv_complete_rows): half the bytes
        everything[column] = everything[column].astype("float32")
    table = pa.Table.from_pandas(everything, preserve_index=False)
    layouts = {run: [[column, str(dtype)] for column, dtype in logs[run].dtypes.items()] for run in runs}
    distinct = sorted({json.dumps(layout) for layout in layouts.values()})
    described = {"columns": [json.loads(layout) for layout in distinct],
                 "runs": {run: distinct.index(json.dumps(layout)) for run, layout in layouts.items()}}
    # Only this file's own description in the schema (not pandas' metadata, which names the pandas version): the
    # same logs always pack to the same bytes under one pyarrow version.
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(described, sort_keys=True).encode()})
    floats = [field.name for field in table.schema if pa.types.is_floating(field.type)]
    target.parent.mkdir(exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd", compression_level=19, use_dictionary=["run"],
                   use_byte_stream_split=floats or False)
    try:
        stored = read_suite_log(tmp)
        assert sorted(stored) == runs, "runs lost in packing"
        for run in runs:
            pd.testing.assert_frame_equal(stored[run], logs[run], check_exact=True)
    except AssertionError as error:
        tmp.unlink()
        raise RuntimeError(f"{target}: the packed log does not read back as written ({error}); nothing was packed")
    return tmp


def read_suite_log(path: Path) -> dict:
    """run -> the DataFrame pandas read from that run's CSV when it was packed (its timing columns at float32
    precision, as read_csv_complete_rows reads them; an episodes table's runs: their last LAST_EPISODES rows)."""
    import pandas as pd
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    described = json.loads(table.schema.metadata[METADATA_KEY])
    if "derived" in described:  # train statistics to recompute from every episode: a form this version never writes
        raise ValueError(f"{path}: its train statistics are to be recomputed from every episode, a form this "
                         f"benchmarks.pack does not read; unpack it with the one of commit c282045b, then pack it")
    everything = table.replace_schema_metadata(None).to_pandas()
    runs_of_layout: dict[int, list[str]] = {}  # layout: an index into described["columns"]
    for run, layout in described["runs"].items():
        runs_of_layout.setdefault(layout, []).append(run)
    logs = {}
    for layout, runs in runs_of_layout.items():
        columns = described["columns"][layout]
        # the rows of every run of one layout typed at once (astype per run was most of the reading time)
        rows = everything[everything["run"].isin(runs)]
        typed = at_timing_precision(rows[[column for column, _ in columns]].astype(dict(columns)))
        groups = dict(iter(typed.groupby(rows["run"], sort=False, observed=True)))
        for run in runs:
            if run in groups:
                logs[run] = groups[run].reset_index(drop=True)
            else:  # a log with a header and no rows
                frame = pd.DataFrame({column: pd.Series(dtype=object) for column, _ in columns})
                logs[run] = at_timing_precision(frame.astype(dict(columns)))
    return {run: logs[run] for run in described["runs"]}


_suite_cache: dict[Path, tuple[tuple, dict]] = {}


def read_packed_log(path: Path):
    """The DataFrame of run_dir/<name>.csv from the nearest suite above run_dir whose packed log holds the run
    (FileNotFoundError naming the CSV when none does). A suite's file is read once per process and change."""
    path = Path(path).absolute()
    for suite_dir in path.parent.parents:
        packed = packed_file(suite_dir, path.name)
        if not packed.is_file():
            continue
        stat = packed.stat()
        signature = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if packed not in _suite_cache or _suite_cache[packed][0] != signature:
            _suite_cache[packed] = (signature, read_suite_log(packed))
        frame = _suite_cache[packed][1].get(path.parent.relative_to(suite_dir).as_posix())
        if frame is not None:
            return frame.copy()
    raise FileNotFoundError(f"{path}: no such file, and no packed log of a suite above it holds it")


def unpack_suite(suite_dir: Path) -> tuple[int, list[str]]:
    """Write every packed run's logs back as CSVs in its directory (a run whose CSV exists keeps it), each read back
    and compared exactly with its packed rows, then remove the packed tables. Returns (runs written, the runs
    whose directory is gone: their rows are dropped)."""
    import csv

    import pandas as pd

    from benchmarks.engine.logger import format_value

    written: set[str] = set()
    gone: set[str] = set()
    for name in PACKED_LOGS:
        if not packed_file(suite_dir, name).exists():
            continue
        for run, frame in read_suite_log(packed_file(suite_dir, name)).items():
            run_dir = suite_dir / run
            if not run_dir.is_dir():
                gone.add(run)
                continue
            if unpacked_files(run_dir, name):
                continue
            tmp = run_dir / (name + ".tmp")
            with open(tmp, "w", newline="") as file:
                writer = csv.writer(file)
                writer.writerow(frame.columns)
                for row in frame.itertuples(index=False, name=None):  # as the trainer writes them: repr-exact floats
                    writer.writerow([format_value(value.item() if hasattr(value, "item") else value) for value in row])
            if len(frame):
                pd.testing.assert_frame_equal(read_csv_complete_rows(tmp), frame, check_exact=True)
            tmp.replace(run_dir / name)
            written.add(run)
    for name in PACKED_LOGS:
        packed_file(suite_dir, name).unlink(missing_ok=True)
    if (suite_dir / SUITE_LOGS).is_dir() and not any((suite_dir / SUITE_LOGS).iterdir()):
        (suite_dir / SUITE_LOGS).rmdir()
    return len(written), sorted(gone)


def default_suites() -> list[Path]:
    return sorted(path for path in Path("results/runs").iterdir() if path.is_dir())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", type=existing_directory,
                        help="suite directories (default: every directory under results/runs)")
    parser.add_argument("--unpack", action="store_true", help="write the packed logs back as each run's CSVs")
    parser.add_argument("--repack", action="store_true",
                        help="write every packed table again, changed or not (after a change of this command)")
    args = parser.parse_args(argv)
    if args.unpack:
        if not args.suites:
            parser.error("--unpack needs the suite directories to unpack")
        for suite_dir in args.suites:
            try:
                written, gone = unpack_suite(suite_dir)
            except ValueError as error:  # a table this version cannot read: it stays as it is
                print(f"not unpacked: {error}")
                continue
            print(f"{suite_dir}: {written} runs unpacked"
                  + (f"; {len(gone)} packed runs have no directory any more, their rows dropped: {', '.join(gone)}"
                     if gone else ""))
        return
    runs = saved = 0
    for suite_dir in args.suites or default_suites():
        try:
            suite_runs, suite_saved = pack_suite(suite_dir, repack=args.repack)
        except (ValueError, RuntimeError) as error:  # this suite (or one of its logs) stays as it was
            print(f"not packed: {error}")
            continue
        runs += suite_runs
        saved += suite_saved
        if unfinished := unfinished_runs(suite_dir):  # a sweep still running, or one to rerun before committing
            named = ", ".join(path.relative_to(suite_dir).as_posix() for path in unfinished[:5])
            print(f"{suite_dir}: {len(unfinished)} run(s) not complete, left as they are (rerun their command to "
                  f"finish them, then pack again): {named}{', ...' if len(unfinished) > 5 else ''}")
    # (logs this small can take more room as tables than as CSVs: said as such, not as "-0.0 MB saved")
    print(f"packed {runs} runs, " + (f"{saved / 1e6:.1f} MB saved" if saved >= 0 else
                                     f"{-saved / 1e6:.1f} MB more (tables' overhead on small logs)"))


if __name__ == "__main__":
    main()
