"""Which network interface this machine uses to reach a host: where gloo must listen in a torchrun job.

Why this module exists: gloo picks its interface from GLOO_SOCKET_IFNAME or,
without it, from what this machine's hostname resolves to; when the hostname
resolves to a loopback address (as /etc/hosts often says, and always inside
a network namespace that shares the host's name) gloo falls back to
127.0.0.1, and ranks on other machines are told to connect to their own
loopback ("Gloo connectFullMesh failed ... Connection refused,
remote=[127.0.0.1]:PORT"). The interface that carries traffic to the
rendezvous host (MASTER_ADDR) is the one the job's peers can reach, so a
joined rank pins gloo to it (`gnnc.runtime.launch.DistConfig.from_env`).

Linux only (the ioctl and /proc/net/if_inet6); elsewhere the lookup answers
None and gloo keeps its own choice.
"""
from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

SIOCGIFADDR = 0x8915  # linux/sockios.h: get an interface's IPv4 address
IF_INET6 = Path("/proc/net/if_inet6")


def interface_toward(host: str, port: int = 9) -> str | None:
    """The name of the interface whose address this machine sends from to reach `host`; None if unknown.

    The address's owner is the answer even when the route goes through `lo` (a
    host reaching its own address).
    """
    source = source_address_toward(host, port)
    return interface_with_address(source) if source is not None else None


def cannot_resolve(host: str) -> str | None:
    """Why `host` does not resolve to an address (the resolver's words), or None when it does."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return exc.strerror
    except UnicodeError as exc:  # a label the IDNA codec refuses (empty, longer than 63 characters)
        return str(exc)
    return None


def source_address_toward(host: str, port: int = 9) -> str | None:
    """The address this machine sends from to reach `host` (None: cannot resolve it or no route).

    A connected UDP socket sends nothing: connecting only asks the kernel for the
    route, and the socket's own address is that route's source.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    except (socket.gaierror, UnicodeError, IndexError):
        return None
    with socket.socket(family, kind, proto) as sock:
        try:
            sock.connect(address)
        except OSError:  # no route to it from here
            return None
        return str(sock.getsockname()[0])


def interface_with_address(address: str) -> str | None:
    """The interface that holds `address` (IPv4 or IPv6), or None."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if ip.version == 6:
        return _ipv6_owner(ip)
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                if ipaddress.ip_address(reply[20:24]) == ip:
                    return name
    return None


def _ipv6_owner(ip: ipaddress.IPv6Address) -> str | None:
    """/proc/net/if_inet6 lists each IPv6 address (32 hex digits) with its interface's name last."""
    try:
        lines = IF_INET6.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and int(fields[0], 16) == int(ip):
            return fields[5]
    return None
