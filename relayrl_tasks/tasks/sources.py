"""Opening a dataset task's rows with Hugging Face `datasets`.

Local JSONL/JSON, Parquet and CSV files are converted once into Arrow files in the `datasets`
cache and memory-mapped from there, so a dataset larger than memory is read from disk, never
held in it; a `save_to_disk` directory is mapped as it is; a hub id is downloaded (where the
hub is reachable). `streaming: true` reads rows as they come instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relayrl.config import ConfigError
from relayrl.config.task import DatasetTaskConfig

SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def open_rows(cfg: DatasetTaskConfig, path: str | None, split: str) -> Any:
    """A datasets.Dataset (or IterableDataset when streaming) of one split."""
    import datasets

    datasets.disable_progress_bars()
    if path is None:  # the hub
        try:
            return datasets.load_dataset(cfg.hub, cfg.hub_config, split=split,
                                         streaming=cfg.streaming)
        except Exception as err:  # the hub, the network or the builder: all reported alike
            raise ConfigError(f"task.hub: {cfg.hub!r} split {split!r} could not be loaded: "
                             f"{type(err).__name__}: {err}") from None
    where = Path(path)
    if not where.exists():
        raise ConfigError(f"task: {where} does not exist")
    fmt = format_of(cfg, where)
    try:
        if fmt == "arrow":
            rows = _from_disk(datasets, where, split)
            return rows.to_iterable_dataset() if cfg.streaming else rows
        files = [str(p) for p in sorted(where.iterdir()) if p.suffix in SUFFIXES] \
            if where.is_dir() else str(where)
        return datasets.load_dataset(fmt, data_files=files, split="train",
                                     streaming=cfg.streaming)
    except ValueError:
        raise
    except Exception as err:  # a malformed file: name it and what the reader said
        raise ConfigError(f"task: {where} could not be read as {fmt}: "
                         f"{type(err).__name__}: {err}") from None


def format_of(cfg: DatasetTaskConfig, path: Path | None = None) -> str:
    """task.format, or the format task.path's suffix (or contents) says."""
    path = path or Path(cfg.path or "")
    if cfg.format != "auto":
        return cfg.format
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            return "arrow"
        kinds = {SUFFIXES[p.suffix] for p in path.iterdir() if p.suffix in SUFFIXES}
        if len(kinds) == 1:
            return kinds.pop()
        raise ConfigError(f"task.path: {path} is neither a save_to_disk directory nor a "
                         f"directory of one kind of file ({sorted(SUFFIXES)}); set task.format")
    if path.suffix not in SUFFIXES:
        raise ConfigError(f"task.path: cannot tell the format of {path} from its suffix "
                         f"(known: {sorted(SUFFIXES)}); set task.format")
    return SUFFIXES[path.suffix]


def _from_disk(datasets: Any, path: Path, split: str) -> Any:
    rows = datasets.load_from_disk(str(path))
    if isinstance(rows, datasets.DatasetDict):
        if split not in rows:
            raise ConfigError(f"task: {path} has no split {split!r}; it has {sorted(rows)}")
        return rows[split]
    return rows
