"""A private network for one multi-node run on this machine: a Linux network namespace the kit makes and removes.

Why: Ray 2.60 binds its GCS, raylets, dashboard agents and core workers to every interface, with no setting to
change it and no authentication (docs/ray.md). Run inside a network namespace of its own, "every interface" is
that namespace's loopback only: nothing outside the run (another host, another local user, a second kit run)
can reach any of its sockets. Every node of a local multi-node run (its ``ray start`` tree or ``vllm serve
--headless``, and the leader's server) is started in the run's namespace (``nsenter --net=...``), each node on
its own loopback address there (127.0.0.2, 127.0.0.3, ... as before); the kit reaches the leader's HTTP server
through a Unix socket in the run's folder (mode 0700), so the run has no TCP socket in the host's network at all.

Making a namespace needs root and iproute2's ``ip`` (CI runs as root): :func:`unavailable` says why not, in one
line, and the caller refuses or falls back (:mod:`kit.engine.multinode`). The namespace is removed by
:meth:`PrivateNetwork.stop`; one left by a killed run is found by its name (``kit-net-<pid>-...``, the pid of the
process that made it) and removed by ``kit clean`` once that process is gone.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass

import psutil

from kit.engine.lifecycle import Lifecycle

PREFIX = "kit-net-"
NETNS_DIR = "/run/netns"
# The opt-in to run local nodes without a private network (Ray's servers then listen on every interface).
ENV_OPEN_NETWORK = "KIT_OPEN_NETWORK"


def open_network_requested() -> bool:
    """Whether the user asked for local nodes on the host's loopback addresses (``KIT_OPEN_NETWORK=1``)."""
    return os.environ.get(ENV_OPEN_NETWORK, "") not in ("", "0")


def unavailable() -> str | None:
    """Why this process cannot make a private network (None: it can)."""
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "making a network namespace needs root (ip netns add)"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: apt-get install iproute2 util-linux)"
    return None


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")


@dataclass
class PrivateNetwork(Lifecycle):
    """``with PrivateNetwork() as net: ManagedProcess(net.prefix() + cmd)``: a network namespace with loopback
    up and nothing else; ``net.prefix()`` runs a command inside it."""

    name: str = ""
    started: bool = False

    def start(self) -> "PrivateNetwork":
        why = unavailable()
        if why:
            raise OSError(f"no private network for the run: {why}")
        self.name = self.name or f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        _ip("netns", "add", self.name)
        self.started = True
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def path(self) -> str:
        return f"{NETNS_DIR}/{self.name}"

    def prefix(self) -> list[str]:
        """What a command runs under to be inside this network (the rest of the process is as before)."""
        return ["nsenter", f"--net={self.path}", "--"]

    def listening(self) -> list[dict]:
        """Every listening TCP socket inside this network: ``{"pid", "name", "ip", "port"}`` (read from inside;
        from the host's network namespace they are invisible)."""
        code = ("import json, psutil\nout = []\nfor c in psutil.net_connections(kind='tcp'):\n"
                "    if c.status == psutil.CONN_LISTEN:\n"
                "        try:\n            name = psutil.Process(c.pid).name() if c.pid else ''\n"
                "        except psutil.Error:\n            name = ''\n"
                "        out.append({'pid': c.pid, 'name': name, 'ip': c.laddr.ip, 'port': c.laddr.port})\n"
                "print(json.dumps(out))\n")
        r = subprocess.run(self.prefix() + [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise OSError(f"could not list the sockets in {self.name}: {r.stderr.strip()[-400:]}")
        return json.loads(r.stdout)

    def stop(self) -> None:
        """Remove the namespace (its processes are ended by their owners first; a socket still open in a
        process that outlived them keeps the namespace until that process ends)."""
        if self.started:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
            self.started = False


def host_listening() -> list[dict]:
    """Every listening TCP socket in this process's (the host's) network namespace: ``{"pid", "ip", "port"}``."""
    return [{"pid": c.pid, "ip": c.laddr.ip, "port": c.laddr.port}
            for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]


def orphans() -> list[str]:
    """Namespaces the kit made whose maker (the pid in the name) is gone: a killed run's."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return []
    out = []
    for n in names:
        if n.startswith(PREFIX):
            try:
                pid = int(n[len(PREFIX):].split("-")[0])
            except ValueError:
                continue
            if not psutil.pid_exists(pid):
                out.append(n)
    return out
