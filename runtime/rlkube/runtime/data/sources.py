"""Where records come from: JSONL, Parquet, or a directory written by Hugging Face datasets'
`save_to_disk`, all read with pyarrow (the `datasets` package is not needed at run time).

Every record comes with the place it was read from, `file:line` (JSONL, 1-based like an editor)
or `file row n` (Parquet and Arrow, 0-based like a dataset index), so that an error about it can
name it. A line that is not JSON is a record too, one that carries its problem instead of
fields: whether it stops the run or is skipped is decided with every other malformed record.

A `save_to_disk` directory holds the Arrow IPC stream files named in its state.json
(`_data_files`) next to dataset_info.json; a DatasetDict's directory holds one such directory a
split and a dataset_dict.json naming them, and its "train" split is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlkube.runtime.infra.errors import DataError
from rlkube.runtime.infra.log import log

_SUFFIX = {"jsonl": ".jsonl", "parquet": ".parquet"}


@dataclass(frozen=True)
class RawRecord:
    where: str  # "file:line" or "file row n"
    values: dict = field(default_factory=dict)
    problem: str | None = None  # set when the record could not even be read (not JSON)


def arrow_directory(path: Path) -> Path:
    """The dataset directory of a save_to_disk output (a DatasetDict's "train" split)."""
    dict_file = path / "dataset_dict.json"
    if dict_file.exists():
        splits = json.loads(dict_file.read_text()).get("splits", [])
        if "train" not in splits:
            raise DataError(
                f"data.source: {path} is a DatasetDict without a 'train' split (splits: {splits}); "
                "point data.source at the split's directory"
            )
        log.info("data.source: %s is a DatasetDict; reading its 'train' split", path)
        path = path / "train"
    return path


def _arrow_files(source: str, path: Path) -> list[Path]:
    if not path.is_dir():
        raise DataError(f"data.source: format 'arrow' wants a directory written by save_to_disk, got {source!r}")
    path = arrow_directory(path)
    state = path / "state.json"
    if state.exists():
        names = [f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise DataError(f"data.source: {state} names Arrow files that are missing: {missing}")
    else:
        files = sorted(path.glob("*.arrow"))
    if not files:
        raise DataError(f"data.source: directory {source!r} holds no Arrow files (state.json or *.arrow)")
    return files


def data_files(source: str, fmt: str) -> list[Path]:
    """The files of `source` in reading order (a directory: its files sorted by name)."""
    if fmt not in ("jsonl", "parquet", "arrow"):
        raise DataError(f"data.format: {fmt!r} names no files; this data must come from jsonl, parquet or arrow")
    path = Path(source)
    if not path.exists():
        raise DataError(f"data.source: {source!r} does not exist")
    if fmt == "arrow":
        return _arrow_files(source, path)
    suffix = _SUFFIX[fmt]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == suffix)
        if not files:
            raise DataError(f"data.source: directory {source!r} holds no *{suffix} files")
        return files
    return [path]


def _read_arrow_table(file: Path):
    import pyarrow as pa

    with pa.memory_map(str(file)) as src:
        try:
            return pa.ipc.open_stream(src).read_all()  # what save_to_disk writes
        except pa.ArrowInvalid:
            src.seek(0)
            return pa.ipc.open_file(src).read_all()


def _table_records(file: Path, table, columns: list[str], optional: list[str]) -> Iterator[RawRecord]:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(
            f"data.source: {file}: no column {missing[0]!r} (columns: {', '.join(table.column_names)}); "
            "data.fields maps field names to columns"
        )
    keep = columns + [c for c in optional if c in table.column_names and c not in columns]
    for n, values in enumerate(table.select(keep).to_pylist()):
        yield RawRecord(f"{file} row {n}", values)


def read_records(files: list[Path], fmt: str, columns: list[str], optional: list[str]) -> Iterator[RawRecord]:
    """Records of `files`. For Parquet and Arrow a column in `columns` missing from a file is an
    error about the file (every record would lack it); `optional` columns are read when present."""
    for file in files:
        if fmt == "jsonl":
            with file.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        values = json.loads(line)
                    except json.JSONDecodeError as e:
                        yield RawRecord(f"{file}:{n}", problem=f"not JSON ({e.msg})")
                        continue
                    if not isinstance(values, dict):
                        yield RawRecord(f"{file}:{n}", problem=f"not a JSON object ({type(values).__name__})")
                        continue
                    yield RawRecord(f"{file}:{n}", values)
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            yield from _table_records(file, pq.read_table(file), columns, optional)
        else:
            yield from _table_records(file, _read_arrow_table(file), columns, optional)
