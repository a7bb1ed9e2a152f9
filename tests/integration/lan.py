"""Hosts on one LAN made of network namespaces: each host a namespace of its own, all joined to one switch (a
bridge in a namespace of its own) by veth pairs, and this process's own namespace on it too, as the operator's
machine. Everything lives in namespaces, so deleting them takes every link and address along: the host's own
routing, firewall and forwarding are not touched. Needs root and iproute2."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest


def ip(*args: str, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True)


def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("ss") is None:
        return "network namespaces need iproute2 (ip, ss)"
    return None


@dataclass
class Lan:
    """A /24 whose .1 is this process's namespace; `hosts` maps a host's name to its namespace and address."""

    tag: str
    subnet: str
    hosts: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def switch(self) -> str:
        return f"fls{self.tag}"

    @property
    def here(self) -> str:
        """This process's address on the LAN."""
        return f"{self.subnet}.1"

    def address(self, host: str) -> str:
        return self.hosts[host][1]

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a process on `host`."""
        return ["ip", "netns", "exec", self.hosts[host][0]]

    def _plug(self, index: int, namespace: str | None, address: str) -> None:
        """A veth pair from `namespace` (None: this one) to the switch's bridge, `address` on its near end."""
        near, far = f"fl{self.tag}h{index}", f"fl{self.tag}s{index}"
        ip("link", "add", near, "type", "veth", "peer", "name", far)
        ip("link", "set", far, "netns", self.switch)
        ip("link", "set", far, "master", "br0", namespace=self.switch)
        ip("link", "set", far, "up", namespace=self.switch)
        if namespace is not None:
            ip("link", "set", near, "netns", namespace)
        ip("addr", "add", f"{address}/24", "dev", near, namespace=namespace)
        ip("link", "set", near, "up", namespace=namespace)

    def add(self, host: str) -> str:
        """A new host on the LAN; its address."""
        index = len(self.hosts) + 2
        namespace, address = f"fl{self.tag}{host}"[:15], f"{self.subnet}.{index}"
        ip("netns", "add", namespace)
        self.hosts[host] = (namespace, address)
        ip("link", "set", "lo", "up", namespace=namespace)
        self._plug(index, namespace, address)
        return address

    def pids(self, host: str) -> set[int]:
        out = subprocess.run(["ip", "netns", "pids", self.hosts[host][0]], capture_output=True, text=True, check=True)
        return {int(p) for p in out.stdout.split()}

    def listening(self, host: str) -> str:
        """The TCP sockets listening on `host` (`ss -Hltn`)."""
        out = subprocess.run([*self.prefix(host), "ss", "-Hltn"], capture_output=True, text=True, check=True)
        return out.stdout.strip()


@contextmanager
def lan(hosts: list[str]) -> Iterator[Lan]:
    """A LAN of `hosts` (short names) and this process; skips the test where namespaces cannot be made."""
    if (why := unavailable()) is not None:
        pytest.skip(why)
    net = Lan(tag=f"{random.randrange(16**4):04x}", subnet=f"10.{random.randrange(128, 192)}.{random.randrange(256)}")
    try:
        ip("netns", "add", net.switch)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.decode().strip()}")
    try:
        ip("link", "add", "br0", "type", "bridge", namespace=net.switch)
        ip("link", "set", "br0", "up", namespace=net.switch)
        net._plug(1, None, net.here)
        for host in hosts:
            net.add(host)
        yield net
    finally:
        # Deleting the switch's namespace deletes the far ends, and with them each pair, this namespace's too.
        for namespace, _ in net.hosts.values():
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "netns", "del", net.switch], capture_output=True)
        subprocess.run(["ip", "link", "del", f"fl{net.tag}h1"], capture_output=True)
