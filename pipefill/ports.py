"""Ports for the listeners our local processes and tests start on 127.0.0.1."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_LISTEN_PORTS_FROM = 10_000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (what outgoing connections take their local port from)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the ephemeral range where the kernel can: a port
    the kernel handed out for listening (bind to 0) comes from that range, and an outgoing connection of another
    process (a trainer's rendezvous, gloo) may take it as its local port before our listener binds it; a
    metrics endpoint that restarts on the same port would then fail every time."""
    low = _ephemeral_low()
    if low - _LISTEN_PORTS_FROM >= 1000:
        for port in random.sample(range(_LISTEN_PORTS_FROM, low), 64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        found: int = sock.getsockname()[1]
        return found
