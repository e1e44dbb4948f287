"""The standard-library corpus of ``tiny-mimo`` and ``tiny-deepseek-v3-trained``, and the token stream batches come from.

The corpus is the CPython standard library source shipped with the running Python
(``sysconfig.get_paths()["stdlib"]``): sorted ``*.py`` files without test suites, data tables and vendored
packages (:func:`corpus_files`); every 50th file is held out for validation. Nothing is downloaded.
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path
from typing import Sequence

import torch

from kit.zoo.tiny.config import BOS_ID, EOS_ID
from kit.zoo.tiny.pycorpus import walk_py

# Directories (any path component) left out of the corpus: test suites, data tables,
# vendored wheels, IDLE/turtle demos and the 2to3 grammar fixtures.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__",
    "encodings", "pydoc_data", "ensurepip", "idlelib", "turtledemo", "lib2to3",
})
MAX_FILE_BYTES = 300_000
VAL_EVERY = 50  # every 50th corpus file is validation text


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def corpus_files(root: Path | None = None, max_files: int | None = None) -> list[Path]:
    """Sorted, deterministic list of stdlib ``*.py`` files used as corpus."""
    root = Path(root) if root else stdlib_root()
    out = []
    for f, rel in walk_py(root):
        if any(p in EXCLUDED_DIRS or p.startswith("test") for p in rel[:-1]):
            continue
        if rel[-1].startswith("test_") or rel[-1] == "__phello__":
            continue
        if not f.is_file() or f.stat().st_size > MAX_FILE_BYTES or f.stat().st_size == 0:
            continue
        out.append(f)
    if max_files is not None:
        out = out[:max_files]
    return out


def split_files(files: Sequence[Path]) -> tuple[list[Path], list[Path]]:
    """(train, validation): every :data:`VAL_EVERY`-th file is held out (a small corpus: its last file)."""
    train = [f for i, f in enumerate(files) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [f for i, f in enumerate(files) if i % VAL_EVERY == VAL_EVERY - 1]
    if not val and len(files) > 1:  # small (quick) corpora: hold out the last file
        train, val = list(files[:-1]), [files[-1]]
    return train, val


def read_corpus(max_files: int | None = None) -> tuple[list[Path], list[Path], list[str], list[str], str]:
    """Train files, validation files, their texts, and one sha256 over every file's path and text."""
    root = stdlib_root()
    train_files, val_files = split_files(corpus_files(root, max_files))
    read = lambda f: f.read_bytes().decode("utf-8", errors="replace")  # noqa: E731
    train_texts = [read(f) for f in train_files]
    val_texts = [read(f) for f in val_files]
    h = hashlib.sha256()
    for f, t in zip(train_files + val_files, train_texts + val_texts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + t.encode() + b"\0")
    return train_files, val_files, train_texts, val_texts, h.hexdigest()


def corpus_summary(train_files: list[Path], val_files: list[Path]) -> dict:
    """The manifest's description of the standard-library corpus."""
    import sys

    root = stdlib_root()
    return {
        "source": "CPython standard library *.py files shipped with the training Python",
        "stdlib_root": str(root),
        "python_version": sys.version.split()[0],
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "excluded_rules": f"dirs starting with 'test', files 'test_*', files > {MAX_FILE_BYTES} bytes",
        "validation": f"every {VAL_EVERY}th file (index % {VAL_EVERY} == {VAL_EVERY - 1})",
        "first_files": [f.relative_to(root).as_posix() for f in train_files[:3]],
        "last_files": [f.relative_to(root).as_posix() for f in train_files[-3:]],
    }


class TokenStream:
    """All documents as one stream: ``<|bos|> doc <|endoftext|> <|bos|> doc ...`` (``bos_id=None``: no BOS,
    as with the zoo tokenizer, whose prompts get none; ``eos_id`` ends every document)."""

    def __init__(self, docs: list[list[int]], bos_id: int | None = BOS_ID, eos_id: int = EOS_ID):
        ids, starts = [], []
        for d in docs:
            starts.append(len(ids))
            if bos_id is not None:
                ids.append(bos_id)
            ids.extend(d)
            ids.append(eos_id)
        self.ids = torch.tensor(ids, dtype=torch.long)
        self.starts = torch.tensor(starts, dtype=torch.long)

    def __len__(self) -> int:
        return int(self.ids.numel())

    def batch(self, g: torch.Generator, batch_size: int, width: int, doc_start_fraction: float) -> torch.Tensor:
        """``batch_size`` windows of ``width`` tokens; a ``doc_start_fraction`` of them start at a document."""
        if len(self) <= width:  # tiny validation streams (quick runs): repeat the stream
            reps = width // len(self) + 2
            self.ids = self.ids.repeat(reps)
            self.starts = torch.cat([self.starts + i * (len(self) // reps) for i in range(reps)])
        n = len(self) - width
        offs = torch.randint(0, n, (batch_size,), generator=g)
        use_start = torch.rand(batch_size, generator=g) < doc_start_fraction
        valid = self.starts[self.starts < n]
        pick = valid[torch.randint(0, len(valid), (batch_size,), generator=g)]
        offs = torch.where(use_start, pick, offs)
        idx = offs.unsqueeze(1) + torch.arange(width).unsqueeze(0)
        return self.ids[idx]
