#!/usr/bin/env python3
"""A tiny DNS server for the image check: answers A queries for the names
given with fixed IPv4 addresses, NOERROR with no answer for other types of
those names, NXDOMAIN for anything else. UDP only, one thread, no recursion.

    dns.py 127.0.0.53 redis.sidecache.test=127.0.0.1 [name=addr ...]

It lets the check prove that getaddrinfo inside the image's root filesystem
reaches a name server (the `dns` line of nsswitch.conf, resolv.conf) and not
only /etc/hosts, with no traffic leaving the machine.
"""
import socket
import struct
import sys


def parse_name(msg, off):
    labels = []
    while True:
        n = msg[off]
        off += 1
        if n == 0:
            return ".".join(labels).lower(), off
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(msg[off:off + n].decode("ascii"))
        off += n


def answer(msg, table):
    ident, flags, qd, _an, _ns, _ar = struct.unpack(">HHHHHH", msg[:12])
    if qd != 1 or flags & 0x8000:
        return None
    name, off = parse_name(msg, 12)
    qtype, qclass = struct.unpack(">HH", msg[off:off + 4])
    question = msg[12:off + 4]
    rd = flags & 0x0100
    if name not in table:
        return struct.pack(">HHHHHH", ident, 0x8083 | rd, 1, 0, 0, 0) + question
    if qtype != 1 or qclass != 1:
        return struct.pack(">HHHHHH", ident, 0x8480 | rd, 1, 0, 0, 0) + question
    rr = struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(table[name])
    return struct.pack(">HHHHHH", ident, 0x8480 | rd, 1, 1, 0, 0) + question + rr


def main():
    addr = sys.argv[1]
    table = dict(a.lower().split("=", 1) for a in sys.argv[2:])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    print(f"dns: serving {sorted(table)} on {addr}:53", flush=True)
    while True:
        msg, peer = s.recvfrom(512)
        try:
            reply = answer(msg, table)
        except (ValueError, IndexError, struct.error):
            reply = None
        if reply is not None:
            s.sendto(reply, peer)
            print(f"dns: {peer[0]} asked, answered {len(reply)} bytes", flush=True)


if __name__ == "__main__":
    main()
