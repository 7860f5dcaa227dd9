"""Helpers the Python bench scripts share (bench/soak.py, bench/listener_memory.py): free
loopback ports and a process's resident memory."""

import socket


def free_ports(n):
    """n distinct ports free on 127.0.0.1 (bound together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def rss_kib(pid):
    """The process's VmRSS in KiB (raises OSError once it is gone)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
