"""Why a process of a tree died when its log does not say.

A vLLM worker killed by a signal leaves no Python traceback: SIGKILL (the kernel's out-of-memory killer, or a
kill from outside) prints nothing at all, and a crash in native code (SIGSEGV, SIGILL, SIGBUS) prints only what
Python's fault handler writes, which the kit turns on in every tree (``PYTHONFAULTHANDLER``). What is left to
tell the cause comes from the kernel:

- the exit status of a dead process, readable from ``/proc/<pid>/stat`` while it is a zombie (before its parent,
  the engine core, reaps it: a poll may or may not see that window);
- the kernel's out-of-memory kill counters (``/proc/vmstat`` for the machine, the cgroup's own), compared with
  their values when the tree started;
- the memory available now and the tree's peak resident size the kit saw.
"""
from __future__ import annotations

import signal
from pathlib import Path

_CGROUP_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def exit_status(pid: int) -> str | None:
    """How a zombie process ended ("killed by SIGSEGV", "exited with code 1"); None if not readable or still
    running. Field 52 of ``/proc/<pid>/stat`` is the status as ``waitpid`` reports it (Linux 3.5 and later)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # after "pid (comm) ": comm may hold spaces and parentheses
    if len(fields) < 50 or fields[0] != "Z":
        return None
    status = int(fields[49])
    if status & 0x7F:
        sig = status & 0x7F
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    return f"exited with code {(status >> 8) & 0xFF}"


def oom_kills() -> int | None:
    """The kernel's out-of-memory kills so far: the machine's and this cgroup's, summed; None if neither is
    readable."""
    total, found = 0, False
    for path in ("/proc/vmstat", *_CGROUP_OOM_FILES):  # each has an "oom_kill N" line
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill" and value.strip().isdigit():
                    total += int(value)
                    found = True
        except OSError:
            continue
    return total if found else None


def hints(oom_at_start: int | None, peak_rss: dict[str, int]) -> list[str]:
    """Lines on memory for a death without a traceback: OOM kills since the tree started, memory available now,
    the tree's largest processes at their peak."""
    import psutil

    lines = []
    now = oom_kills()
    if now is not None and oom_at_start is not None:
        if now > oom_at_start:
            lines.append(f"hint: the kernel's out-of-memory killer ran {now - oom_at_start} time(s) while the tree "
                         "ran: a process killed by SIGKILL without a traceback was most likely its victim")
        else:
            lines.append("no out-of-memory kill counted while the tree ran (kernel counters)")
    avail = psutil.virtual_memory().available
    top = sorted(peak_rss.items(), key=lambda kv: -kv[1])[:3]
    peaks = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in top)
    lines.append(f"memory available now {avail / 2**30:.1f} GiB" + (f"; peak resident: {peaks}" if peaks else ""))
    return lines
