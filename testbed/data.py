"""Where a benchmark's rows come from: a local copy, the Hugging Face cache, or the hub, in that order (DESIGN.md §5).

The machines this project is built on reach package registries only, so real data sets are read from a local
copy wherever one is given, in the layouts they ship in: the hub's parquet shards, plain JSON-lines files, MATH's
original release (one JSON file per problem under MATH/{train,test}/<subject>/) and MBPP's single files. A copy
that is not what it claims (Git LFS pointers instead of data, only some of a data set's parts) is refused with
the command that fixes it. Without a copy, the Hugging Face cache and then the hub are tried; where none answers,
`DataUnavailable` names the data set and how to point at a local copy, after at most a few seconds of probing.
What a row means is the task's business (tasks.py); this file only finds and reads rows.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


class DataUnavailable(RuntimeError):
    """A data set is neither in a local copy, nor in the Hugging Face cache, nor on a reachable hub."""


@dataclass(frozen=True)
class HubSource:
    title: str
    repo: str
    subdir: str
    """the folder of the configuration used inside the repository ('' for all of it)"""
    train_split: str
    heldout_split: str
    columns: str
    parts: tuple[str, ...] = ()
    """folders that together make the data set (MATH's seven subjects): a copy holding only some is refused"""
    single_files: tuple[str, ...] = ()
    """names of a file holding every split (MBPP's original release), read where no split files are found; the
    first one present is used"""
    split_of: Callable[[dict], str] | None = None
    """the split of a row of a `single_files` file"""


def unavailable(source: HubSource, why: str) -> DataUnavailable:
    return DataUnavailable(
        f"{source.title} is not available: {why}. Download it where the hub is reachable (`hf download {source.repo} "
        f"--repo-type dataset --local-dir DIR` or `git clone https://huggingface.co/datasets/{source.repo} DIR`) and "
        f"pass data_dir=DIR (train.py --data-dir DIR for --task, --eval-data-dir DIR for --eval-task; eval.py "
        f"--data-dir DIR). DIR may also hold plain {source.train_split}.jsonl and "
        f"{source.heldout_split}.jsonl (or .parquet) files with the data set's columns: {source.columns}.")


def hub_reachable(endpoint: str, timeout_s: float = 3.0) -> bool:
    """Whether `endpoint` answers within `timeout_s`, name lookup included (the probe thread is not waited for)."""
    answered = []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
            answered.append(True)
        except urllib.error.HTTPError:
            answered.append(True)  # an HTTP error status is still an answer
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answered)


def hub_snapshot(source: HubSource) -> Path:
    """The data set's files: from the Hugging Face cache, else downloaded when the hub answers a quick probe
    (without the probe, huggingface_hub retries an unreachable hub for about 25 s)."""
    from huggingface_hub import constants, snapshot_download  # on use, like math_verify: arith needs neither
    from huggingface_hub.errors import LocalEntryNotFoundError
    patterns = [f"{source.subdir}/*"] if source.subdir else None
    try:
        return Path(snapshot_download(source.repo, repo_type="dataset", allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if constants.HF_HUB_OFFLINE or not hub_reachable(constants.ENDPOINT):
        raise unavailable(source, f"it is not in the Hugging Face cache and {constants.ENDPOINT} is "
                               f"{'switched off by HF_HUB_OFFLINE' if constants.HF_HUB_OFFLINE else 'unreachable'}")
    return Path(snapshot_download(source.repo, repo_type="dataset", allow_patterns=patterns))


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def _read_rows(path: Path) -> list[dict]:
    """The rows of a parquet, JSON-lines or JSON file (a JSON array of rows, or one row: MATH's original release)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet  # comes with datasets
        return pyarrow.parquet.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.suffix == ".json":
            try:
                data = json.load(f)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: not valid JSON ({err})") from None
            return data if isinstance(data, list) else [data]
        return [_json_line(path, number, line) for number, line in enumerate(f, 1) if line.strip()]


def _json_line(path: Path, number: int, line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}, line {number}: not a JSON row ({err.msg}): {line.strip()[:80]!r}") from None


def _is_lfs_pointer(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(LFS_POINTER)) == LFS_POINTER


def _split_files(base: Path, split: str) -> list[Path]:
    """The data files of `split` under `base`: named like the hub's shards (`train-00000-of-00001.parquet`) or
    plainly (`train.jsonl`), or lying in a folder named after the split (MATH's `train/algebra/1.json`). Only
    these names: `train_socratic.jsonl` beside `train.jsonl` (openai/grade-school-math) is another data set."""
    named = re.compile(rf"{split}(-\d+-of-\d+(-[0-9a-f]+)?)?({'|'.join(map(re.escape, DATA_SUFFIXES))})")
    return sorted(p for p in base.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file() and
                  (named.fullmatch(p.name) or split in p.relative_to(base).parts[:-1]))


def _refuse_lfs_pointers(root: Path, source: HubSource, files: list[Path]) -> None:
    pointers = [p for p in files if _is_lfs_pointer(p)]
    if pointers:
        raise DataUnavailable(
            f"{source.title}: {len(pointers)} of the {len(files)} data files under {root} are Git LFS pointers, not "
            f"data (e.g. {pointers[0]}): the repository was cloned without git-lfs. Run `git lfs install && git lfs "
            f"pull` inside the clone, or download it with `hf download {source.repo} --repo-type dataset "
            f"--local-dir DIR`.")


def _release_subject(root: Path, source: HubSource) -> str | None:
    """The folder's name where `root` is one part of a release laid out by split first (MATH's original
    MATH/train/algebra): chosen on its own, it is read in every split (MATH/test/algebra too); else None."""
    splits = (source.train_split, source.heldout_split)
    return root.name if root.name in source.parts and root.parent.name in splits else None


def _refuse_missing_parts(root: Path, base: Path, source: HubSource, split: str, files: list[Path]) -> None:
    found = {part for p in files for part in p.relative_to(base).parts[:-1]} & set(source.parts)
    if found and found != set(source.parts):
        missing = ", ".join(sorted(set(source.parts) - found))
        raise unavailable(source, f"{root} holds the {split} split of {len(found)} of its {len(source.parts)} folders "
                               f"({', '.join(sorted(found))}) and lacks {missing} (a partial download or cache). To "
                               f"use one of them on purpose, pass that folder itself as data_dir (e.g. "
                               f"{files[0].parent}, which reads both of its splits); otherwise complete the copy")


def split_rows(root: Path, source: HubSource, split: str) -> list[dict]:
    """All rows of `split` under `root` (see `_split_files`), inside the configuration's folder when `root` has
    one, or in the same part's folder of that split where `root` is a part of a release laid out by split
    (`_release_subject`); else, where `root` holds one of `source.single_files`, its rows of that split."""
    base = root / source.subdir if source.subdir and (root / source.subdir).is_dir() else root
    chosen = _release_subject(root, source)
    if chosen is not None:
        base = root.parent.parent
    files = [p for p in _split_files(base, split) if chosen is None or chosen in p.relative_to(base).parts[:-1]]
    single = next((root / name for name in source.single_files if (root / name).is_file()), None)
    if not files and single is None:
        expected = ", ".join([f"{split}.jsonl", f"{split}-*.parquet", *source.single_files])
        raise unavailable(source, f"{root} has no {split} split ({expected})")
    _refuse_lfs_pointers(root, source, files or [single])
    if not files:
        try:
            return [row for row in _read_rows(single) if source.split_of(row) == split]
        except (KeyError, TypeError) as error:
            raise ValueError(f"{source.title}: rows of {single} have no task_id to split them by: "
                             f"{type(error).__name__} {error}") from error
    if chosen is None:
        _refuse_missing_parts(root, base, source, split, files)
    return [row for path in files for row in _read_rows(path)]
