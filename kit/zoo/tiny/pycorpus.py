"""A Python-source corpus from what is installed here: the CPython standard library and site-packages.

Nothing is downloaded. :func:`collect` walks the sources in a fixed order, keeps ``*.py`` files that look
like hand-written code (filters below), drops exact duplicates by the sha256 of their bytes (the first
copy in walk order stays), caps each top-level package so that a few large packages do not dominate,
and holds out files by content hash (:func:`is_heldout`: about 2 %, stable when files are added or
removed). :func:`write_pack` stores the result as one xz-compressed JSON-lines file (small enough to
travel to a training machine) plus a JSON manifest; :func:`read_pack` reads it back.
:func:`heldout_prompts` cuts code prompts from held-out files whose continuation does not occur verbatim
in the training text.

Command line (:mod:`kit.cli.tiny`)::

    kit tiny corpus build [--out build/pycorpus/pycode.jsonl.xz] [--package-cap-mb 6]
    kit tiny corpus prompts --corpus PACK --out data/prompts/pycode-heldout.jsonl [--n 16]
"""
from __future__ import annotations

import hashlib
import json
import lzma
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kit.core.models import REPO_ROOT

DEFAULT_PACK = REPO_ROOT / "build" / "pycorpus" / "pycode.jsonl.xz"

# Any path component: test suites, vendored copies, demos, data/grammar fixtures, build trees.
EXCLUDED_DIRS = frozenset({
    "test", "tests", "testing", "idle_test", "__pycache__", "site-packages", "dist-packages",
    "encodings", "pydoc_data", "ensurepip", "idlelib", "turtledemo", "lib2to3",
    "_vendor", "vendor", "_vendored", "vendored", "third_party", "thirdparty", "externals", "benchmarks",
    "examples", "docs", "build",
})
MAX_FILE_BYTES = 200_000
MIN_FILE_BYTES = 200
MAX_LINE_CHARS = 300          # longer lines: data tables, minified or serialized content
MAX_MEAN_LINE_CHARS = 60
HELDOUT_PER_MILLE = 20        # files whose content hash falls below this (of 1000) are held out
DEFAULT_PACKAGE_CAP = 6_000_000


@dataclass(frozen=True)
class Doc:
    source: str     # "stdlib" or "site-packages"
    path: str       # relative to the source root, posix
    sha256: str     # of the file's bytes
    text: str

    @property
    def package(self) -> str:
        return f"{self.source}:{self.path.split('/', 1)[0]}"


def default_sources() -> list[tuple[str, Path]]:
    """The running interpreter's standard library and its (pure and platform) site-packages."""
    paths = sysconfig.get_paths()
    out = [("stdlib", Path(paths["stdlib"]).resolve())]
    for key in ("purelib", "platlib"):
        p = Path(paths[key]).resolve()
        if p.is_dir() and all(p != q for _, q in out):
            out.append(("site-packages", p))
    return out


def walk_py(root: Path) -> Iterator[tuple[Path, tuple[str, ...]]]:
    """Every ``*.py`` under ``root`` in a fixed order (by relative posix path), with its relative path parts."""
    for f in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        yield f, f.relative_to(root).parts


def is_heldout(sha256: str) -> bool:
    return int(sha256[:8], 16) % 1000 < HELDOUT_PER_MILLE


def _skip_path(rel: tuple[str, ...]) -> bool:
    dirs, name = rel[:-1], rel[-1]
    if any(d in EXCLUDED_DIRS or d.startswith("test") or d.endswith((".dist-info", ".egg-info")) for d in dirs):
        return True
    return name.startswith("test_") or name.endswith(("_test.py", "_pb2.py", "_pb2_grpc.py", "conftest.py"))


def looks_like_code(text: str) -> bool:
    """Hand-written code, not a data table: short lines, and at least some statements."""
    lines = text.splitlines()
    if not lines or max(len(x) for x in lines) > MAX_LINE_CHARS:
        return False
    if sum(len(x) for x in lines) / len(lines) > MAX_MEAN_LINE_CHARS:
        return False
    return bool(re.search(r"^\s*(def|class|import|from|return|if|for)\b", text, re.M))


def collect(sources: list[tuple[str, Path]] | None = None, package_cap: int = DEFAULT_PACKAGE_CAP,
            max_files: int | None = None) -> tuple[list[Doc], dict]:
    """Deduplicated, filtered, capped documents in a fixed order, and counts of what was left out."""
    sources = sources or default_sources()
    seen: set[str] = set()
    per_pkg: dict[str, list[Doc]] = {}
    stats = {"files_seen": 0, "skipped_path": 0, "skipped_size": 0, "skipped_not_utf8": 0,
             "skipped_not_code": 0, "duplicates": 0, "over_package_cap": 0}
    for source, root in sources:
        for f, rel in walk_py(root):
            stats["files_seen"] += 1
            if _skip_path(rel) or not f.is_file():
                stats["skipped_path"] += 1
                continue
            size = f.stat().st_size
            if not MIN_FILE_BYTES <= size <= MAX_FILE_BYTES:
                stats["skipped_size"] += 1
                continue
            data = f.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                stats["skipped_not_utf8"] += 1
                continue
            if not looks_like_code(text):
                stats["skipped_not_code"] += 1
                continue
            sha = hashlib.sha256(data).hexdigest()
            if sha in seen:
                stats["duplicates"] += 1
                continue
            seen.add(sha)
            doc = Doc(source, "/".join(rel), sha, text)
            per_pkg.setdefault(doc.package, []).append(doc)
    docs: list[Doc] = []
    for pkg in sorted(per_pkg):
        # Within a package over the cap, keep files in content-hash order (a fixed pseudo-random sample).
        kept, total = [], 0
        for d in sorted(per_pkg[pkg], key=lambda d: d.sha256):
            if total + len(d.text) > package_cap and kept:
                stats["over_package_cap"] += 1
                continue
            kept.append(d)
            total += len(d.text)
        docs.extend(sorted(kept, key=lambda d: d.path))
    if max_files is not None:
        docs = docs[:max_files]
    return docs, stats


def split(docs: list[Doc]) -> tuple[list[Doc], list[Doc]]:
    train = [d for d in docs if not is_heldout(d.sha256)]
    val = [d for d in docs if is_heldout(d.sha256)]
    if not val and len(docs) > 1:  # tiny corpora (tests): hold out the last file
        train, val = docs[:-1], docs[-1:]
    return train, val


def content_sha256(docs: list[Doc]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(f"{d.source}/{d.path}".encode() + b"\0" + d.sha256.encode() + b"\0")
    return h.hexdigest()


def write_pack(docs: list[Doc], out: Path, stats: dict, sources: list[tuple[str, Path]], package_cap: int) -> dict:
    """``out`` (xz JSON lines, one document a line, with its split) and ``out`` + ``.manifest.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    train, val = split(docs)
    heldout = {d.sha256 for d in val}
    with lzma.open(out, "wt", encoding="utf-8", preset=6) as fh:
        for d in docs:
            fh.write(json.dumps({"source": d.source, "path": d.path, "sha256": d.sha256,
                                 "split": "val" if d.sha256 in heldout else "train", "text": d.text}) + "\n")
    pkgs: dict[str, int] = {}
    for d in docs:
        pkgs[d.package] = pkgs.get(d.package, 0) + len(d.text.encode())
    manifest = {
        "pack": out.name,
        "python_version": sys.version.split()[0],
        "sources": {name: str(p) for name, p in sources},
        "filters": {"excluded_dirs": sorted(EXCLUDED_DIRS), "file_bytes": [MIN_FILE_BYTES, MAX_FILE_BYTES],
                    "max_line_chars": MAX_LINE_CHARS, "max_mean_line_chars": MAX_MEAN_LINE_CHARS,
                    "dedup": "sha256 of the file bytes, first copy in walk order",
                    "package_cap_bytes": package_cap,
                    "heldout": f"int(sha256[:8], 16) % 1000 < {HELDOUT_PER_MILLE}"},
        "stats": stats,
        "train_files": len(train), "train_bytes": sum(len(d.text.encode()) for d in train),
        "val_files": len(val), "val_bytes": sum(len(d.text.encode()) for d in val),
        "content_sha256": content_sha256(docs),
        "pack_bytes": out.stat().st_size,
        "largest_packages_bytes": dict(sorted(pkgs.items(), key=lambda kv: -kv[1])[:25]),
    }
    Path(str(out) + ".manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_pack(path: Path | str) -> tuple[list[Doc], list[Doc]]:
    """(train, val) documents of a pack, in stored order."""
    train, val = [], []
    with lzma.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            (val if r["split"] == "val" else train).append(Doc(r["source"], r["path"], r["sha256"], r["text"]))
    return train, val


_DEF = re.compile(r"^( {0,8})def [A-Za-z_]\w*\(.*$", re.M)


def heldout_prompts(train: list[Doc], val: list[Doc], n: int = 16, prompt_lines: int = 4,
                    check_chars: int = 120) -> list[dict]:
    """Prompts cut from held-out files: a function's ``def`` line and the next lines (``prompt_lines`` in
    all, none of them blank, nor the line after), at most one per file, files in content-hash order. A prompt is kept only if neither it nor the
    ``check_chars`` characters that follow it in its file occur verbatim in the training text."""
    train_text = "\n".join(d.text for d in train)
    out: list[dict] = []
    for d in sorted(val, key=lambda d: d.sha256):
        for m in _DEF.finditer(d.text):
            lines = d.text[m.start():].split("\n")
            if len(lines) < prompt_lines + 4:
                continue
            prompt = "\n".join(lines[:prompt_lines]) + "\n"
            if len(prompt) > 400 or not all(x.strip() for x in lines[:prompt_lines + 1]):
                continue
            follow = d.text[m.start() + len(prompt): m.start() + len(prompt) + check_chars]
            if prompt in train_text or follow in train_text:
                continue
            out.append({"prompt": prompt, "source": f"{d.source}/{d.path}", "sha256": d.sha256})
            break
        if len(out) >= n:
            break
    return out
