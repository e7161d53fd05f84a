#!/usr/bin/env python3
"""A delay line for the links of tools/netns-cluster.sh, where the kernel has no sch_netem.

Each of the N links is two TAP devices: PREFIXv<i> (the bridge's port) and PREFIXe<i>
(which netns-cluster.sh moves into node i as its eth0). This process holds both ends and
copies every Ethernet frame from one to the other DELAY after it arrived, in order, in both
directions, so a frame between two nodes crosses two links and waits 2 × DELAY, as with
netem on both ends of each link. Rates stay with tc tbf on the devices.

    netdelay.py PREFIX N DELAY [MTU]     DELAY as tc writes it: 2ms, 500us, 0.01s

It prints "ready" on stdout once the 2N devices exist (they are gone when it exits) and
runs until it is killed. Frames are copied by this process, so they cost it CPU: about
10-20 µs a frame, so the devices get a large MTU (9000 by default) to keep the frame rate
down. Timing: select()'s microsecond timeout, so a frame leaves within about 0.1 ms of
its time on an idle machine.
"""

import errno
import fcntl
import heapq
import os
import re
import select
import socket
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
SIOCSIFMTU = 0x8922


def seconds(text):
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(s|ms|us|usec|msec|sec)?", text.strip())
    if not m:
        sys.exit(f"netdelay: DELAY '{text}' is not a time such as 2ms, 500us or 0.01s")
    value = float(m.group(1))
    unit = m.group(2) or "us"  # tc's default unit
    return value * {"s": 1, "sec": 1, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}[unit]


def tap(name, mtu):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    except OSError as e:
        why = {
            errno.EBUSY: "it exists already: another delay line of this prefix? (netns-cluster.sh down)",
            errno.EPERM: "this needs root (CAP_NET_ADMIN)",
        }.get(e.errno, "")
        sys.exit(f"netdelay: cannot create TAP device {name}: {e.strerror}; {why}".rstrip("; "))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        fcntl.ioctl(s, SIOCSIFMTU, struct.pack("16si", name.encode(), mtu))
    finally:
        s.close()
    return fd


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit("usage: netdelay.py PREFIX N DELAY [MTU]")
    prefix, n, delay = sys.argv[1], int(sys.argv[2]), seconds(sys.argv[3])
    mtu = int(sys.argv[4]) if len(sys.argv) == 5 else 9000
    peer = {}
    for i in range(1, n + 1):
        a, b = tap(f"{prefix}v{i}", mtu), tap(f"{prefix}e{i}", mtu)
        peer[a], peer[b] = b, a
    print("ready", flush=True)
    due = []  # (time, sequence, out fd, frame): the sequence keeps each direction in order
    seq = 0
    fds = list(peer)
    while True:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, out, frame = heapq.heappop(due)
            try:
                os.write(out, frame)
            except OSError:
                pass  # the device is down (a cut link): the frame is lost, as on a wire
        timeout = max(0.0, due[0][0] - now) if due else None
        ready, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            for _ in range(64):
                try:
                    frame = os.read(fd, 65536)
                except BlockingIOError:
                    break
                except OSError:
                    break  # the device is down
                seq += 1
                heapq.heappush(due, (now + delay, seq, peer[fd], frame))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
