"""``kit clean``: empty the kit's cache of run folders, and remove private networks left by killed runs.

A run that succeeds removes its own folder (``kit-run-*``, ``kit-srv-*``, ``kit-pd-*``, ``kit-nodes-*``); a failed
one keeps it for its log, as does every run under ``KIT_KEEP_RUNS=1``. This command removes those folders, and the
network namespaces (``kit-net-<pid>-...``) whose maker is gone. ``--all`` also removes the random checkpoints
(written again, by seed, when a run needs them). Nothing outside the cache and the kit's own namespaces is touched.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from kit.core.models import cache_dir
from kit.engine.guard import RUN_DIR_PREFIXES

RUN_FOLDERS = tuple(f"{prefix}*" for prefix in RUN_DIR_PREFIXES)
CHECKPOINTS = "random"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kit clean", description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="also the random checkpoints")
    ap.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    args = ap.parse_args(argv)
    from kit.engine import netns

    root = cache_dir()
    gone = [p for pattern in RUN_FOLDERS for p in sorted(root.glob(pattern)) if p.is_dir()]
    if args.all and (root / CHECKPOINTS).is_dir():
        gone.append(root / CHECKPOINTS)
    nets = netns.orphans()
    for p in gone:
        print(f"{'would remove' if args.dry_run else 'removed'} {p}")
        if not args.dry_run:
            shutil.rmtree(p, ignore_errors=True)
    for n in nets:
        print(f"{'would remove' if args.dry_run else 'removed'} network namespace {n}")
        if not args.dry_run:
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=30)
    print(f"kit clean: {len(gone)} folders, {len(nets)} namespaces{' (dry run)' if args.dry_run else ''} in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
