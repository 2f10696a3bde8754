#!/usr/bin/env python3
"""A kvmscope control-socket client in Python, standard library only.

It shows that the protocol (docs/PROTOCOL.md) serves other languages: it
receives KVM stats fds over SCM_RIGHTS (socket.recv_fds), parses the binary
stats format itself (header, id, descriptors, data; docs in
/work/shared/KVM_STATS_ABI.md, kernel Documentation/virt/kvm/api.rst), checks
it as a careful reader should, and prints the stats it read from the kernel.

    python3 scripts/kvmscope_client.py --socket /tmp/kvmscope.sock
    python3 scripts/kvmscope_client.py --socket S --vcpu 0 --names exits,pf_fixed --json
    python3 scripts/kvmscope_client.py --socket S --provider kvmscope --vm
    python3 scripts/kvmscope_client.py --socket S --execute '{"execute":"query-vm"}'

Values are printed as the file holds them: integers in each stat's unit,
base and exponent (`kvmscope stats` scales them). --names takes stat names
and `*` for any run of characters, as `kvmscope stats` does.
"""

import argparse
import fcntl
import json
import os
import re
import socket
import stat
import struct
import sys
import unicodedata

HEADER = struct.Struct("=6I")  # flags, name_size, num_desc, id_offset, desc_offset, data_offset
DESC = struct.Struct("=IhHII")  # flags, exponent, size, offset, bucket_size
MAX_NAME_SIZE = 1 << 20  # QEMU's caps, checked before anything is allocated
MAX_NUM_DESC = 1024
MAX_FDS = 253  # SCM_MAX_FD: most fds one message carries

TYPES = {0: "cumulative", 1: "instant", 2: "peak", 3: "linear-histogram", 4: "log2-histogram"}
UNITS = {0x00: "none", 0x10: "bytes", 0x20: "seconds", 0x30: "cycles", 0x40: "boolean"}
BASES = {0x000: 10, 0x100: 2}


class StatsError(Exception):
    """The stats file breaks a rule of the format."""


class Connection:
    """A control-socket connection: JSON lines out, lines with their fds in."""

    def __init__(self, path, timeout):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as e:
            # The same kind of error (callers wait out FileNotFoundError and
            # ConnectionRefusedError while a VMM starts), naming the socket
            # and, where it tells, why.
            raise type(e)(e.errno, "%s%s" % (e.strerror, connect_hint(path)), path) from None
        self.buf = b""
        self.fds = []  # (index of the last byte of the read that brought it, fd)
        self.greeting = self.read_line()[0]
        if "error" in self.greeting:
            raise RuntimeError("refused: %s" % self.greeting["error"]["desc"])
        # QMP capability negotiation: nothing else is served before it.
        self.execute("qmp_capabilities")

    def read_line(self):
        """The next JSON line and the fds that rode on it (they belong to the
        line holding the last byte of the recvmsg that brought them)."""
        while b"\n" not in self.buf:
            data, fds, flags, _ = socket.recv_fds(self.sock, 1 << 16, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            if flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                raise RuntimeError("fds were dropped: no room for them")
            if not data:
                raise RuntimeError("the VMM closed the connection")
            self.buf += data
            self.fds += [(len(self.buf) - 1, fd) for fd in fds]
        nl = self.buf.index(b"\n")
        line, self.buf = self.buf[: nl + 1], self.buf[nl + 1 :]
        mine = [fd for at, fd in self.fds if at <= nl]
        self.fds = [(at - nl - 1, fd) for at, fd in self.fds if at > nl]
        return json.loads(line), mine

    def execute(self, command, arguments=None):
        """Runs a command; its return value and fds, or raises on an error reply."""
        req = {"execute": command, "arguments": arguments or {}}
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        reply, fds = self.read_line()
        while "event" in reply:  # events may come before the reply
            reply, fds = self.read_line()
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise RuntimeError("%s: %s" % (reply["error"]["class"], reply["error"]["desc"]))
        return reply["return"], fds


def connect_hint(path):
    """Why connecting to path failed, where the path tells: ': it is not a
    socket', a directory, or a socket nobody listens on (left by a VMM that
    exited)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return ""
    if stat.S_ISDIR(mode):
        return ": it is a directory (give the socket file in it)"
    if not stat.S_ISSOCK(mode):
        return ": it is not a socket"
    return ": nothing listens on it (a socket left by a VMM that exited?)"


def is_stats_kind(fd, kind):
    """Whether fd is a stats file of kind: KVM's anon_inode:kvm-vm-stats or
    anon_inode:kvm-vcpu-stats:N, or a VMM's own memfd:kvmscope-stats (a memfd
    indeed: only shared memory has seals)."""
    link = fd_target(fd)
    if kind == "kvmscope-stats":
        if link.split(" ")[0] != "/memfd:kvmscope-stats":
            return False
        try:
            fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            return False
        return True
    name = link[len("anon_inode:"):] if link.startswith("anon_inode:") else ""
    return name == kind or name.split(":")[0] == kind


def fd_target(fd):
    """What an fd is, as /proc/self/fd names it (anon_inode:kvm-vm-stats, a
    path), a pipe's or socket's inode number left out (pipe, socket)."""
    try:
        link = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        return "unknown"
    m = re.fullmatch(r"(.*):\[[0-9]+\]", link)
    return m.group(1) if m else link


def pread_exact(fd, size, offset, block):
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise StatsError("the %s at offset %d ends after %d of its %d bytes" % (block, offset, len(data), size))
    return data


# Characters a terminal acts on, besides control characters: line and
# paragraph separators, bidirectional overrides (kvm-stats refuses them too).
MOVERS = {0x2028, 0x2029} | set(range(0x202A, 0x202F)) | set(range(0x2066, 0x206A))


def cstring(raw, what):
    if b"\0" not in raw:
        raise StatsError("%s has no NUL terminator within name_size bytes" % what)
    try:
        text = raw[: raw.index(b"\0")].decode("utf-8")
    except UnicodeDecodeError:
        raise StatsError("%s is not UTF-8" % what) from None
    if not text:
        raise StatsError("%s is empty" % what)
    if any(unicodedata.category(c) == "Cc" or ord(c) in MOVERS for c in text):
        raise StatsError("%s holds a control character" % what)
    return text


def check_descriptor(d):
    kind, unit, base = d["flags"] & 0xF, d["flags"] & 0xF0, d["flags"] & 0xF00
    name = d["name"]
    if kind not in TYPES or unit not in UNITS or base not in BASES:
        raise StatsError("%s: unknown type/unit/base in flags %#x" % (name, d["flags"]))
    exp = d["exponent"]
    if (unit in (0x00, 0x10, 0x30) and exp < 0) or (unit == 0x20 and exp > 0) or (unit == 0x40 and exp != 0):
        raise StatsError("%s: exponent %d does not fit unit %s" % (name, exp, UNITS[unit]))
    if d["size"] == 0:
        raise StatsError("%s: size is 0" % name)
    if (d["bucket_size"] != 0) != (kind == 3):
        raise StatsError("%s: bucket_size %d for a %s stat" % (name, d["bucket_size"], TYPES[kind]))
    if unit == 0x40 and (kind == 4 or (kind == 3 and d["size"] != 2)):
        raise StatsError("%s: a boolean is a scalar or a 2-bucket linear histogram" % name)
    if d["offset"] % 8:
        raise StatsError("%s: offset %d is not a multiple of 8" % (name, d["offset"]))
    d.update(type=TYPES[kind], unit=UNITS[unit], base=BASES[base])


class StatsFile:
    """A stats fd with its schema, read and checked once."""

    def __init__(self, fd):
        self.fd = fd
        flags, name_size, num_desc, id_off, desc_off, data_off = HEADER.unpack(pread_exact(fd, HEADER.size, 0, "header"))
        if flags != 0:
            raise StatsError("header flags are %#x, expected 0" % flags)
        if not 0 < name_size <= MAX_NAME_SIZE or num_desc > MAX_NUM_DESC:
            raise StatsError("name_size %d or num_desc %d is out of bounds" % (name_size, num_desc))
        for field, off in (("id_offset", id_off), ("desc_offset", desc_off), ("data_offset", data_off)):
            if off < HEADER.size or off % 8:
                raise StatsError("%s %d is inside the header or not a multiple of 8" % (field, off))
        self.id = cstring(pread_exact(fd, name_size, id_off, "id"), "the id string")
        if not self.id.startswith("kvm"):
            raise StatsError("the id %r does not start with kvm" % self.id)
        stride = DESC.size + name_size
        raw = pread_exact(fd, stride * num_desc, desc_off, "descriptors")
        self.stats = []
        for i in range(num_desc):
            chunk = raw[i * stride : (i + 1) * stride]
            flags, exponent, size, offset, bucket_size = DESC.unpack(chunk[: DESC.size])
            d = dict(flags=flags, exponent=exponent, size=size, offset=offset, bucket_size=bucket_size)
            d["name"] = cstring(chunk[DESC.size :], "the name of stat #%d" % i)
            check_descriptor(d)
            self.stats.append(d)
        self.check_layout(id_off, name_size, desc_off, stride * num_desc, data_off)
        self.data_offset = data_off

    def check_layout(self, id_off, name_size, desc_off, desc_len, data_off):
        names = [d["name"] for d in self.stats]
        if len(set(names)) != len(names):
            raise StatsError("stat names are not unique")
        spans = sorted((d["offset"], d["offset"] + 8 * d["size"], d["name"]) for d in self.stats)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if end > start:
                raise StatsError("stats %s and %s share bytes of the data block" % (a, b))
        self.data_size = max((end for _, end, _ in spans), default=0)
        blocks = [("id", id_off, id_off + name_size), ("descriptors", desc_off, desc_off + desc_len), ("data", data_off, data_off + self.data_size)]
        for i, (a, s1, e1) in enumerate(blocks):
            for b, s2, e2 in blocks[i + 1 :]:
                if s1 < e2 and s2 < e1 and e1 > s1 and e2 > s2:
                    raise StatsError("the %s and %s blocks overlap" % (a, b))

    def read(self):
        """One pread of the data block: {name: value or list of bucket counts}."""
        words = struct.unpack("=%dQ" % (self.data_size // 8), pread_exact(self.fd, self.data_size, self.data_offset, "data"))
        out = {}
        for d in self.stats:
            values = words[d["offset"] // 8 : d["offset"] // 8 + d["size"]]
            if d["unit"] == "boolean" and d["size"] == 1:
                if values[0] > 1:
                    raise StatsError("boolean %s reads %d" % (d["name"], values[0]))
                out[d["name"]] = bool(values[0])
            else:
                out[d["name"]] = values[0] if d["type"] in ("cumulative", "instant", "peak") else list(values)
        return out


def receive(conn, vm, vcpu, provider="kvm"):
    """Stats fds for the VM and/or vCPUs: [(entry naming the fd, StatsFile)].
    provider "kvmscope" asks for the VMM's own stats, in the same format."""
    requests = ([{"target": "vm"}] if vm else []) + ([{"target": "vcpu", "vcpu": vcpu}] if vcpu is not None else [])
    if provider != "kvm":
        for args in requests:
            args["provider"] = provider
    out = []
    for args in requests:
        ret, fds = conn.execute("get-stats-fd", args)
        if len(fds) != len(ret["fds"]):
            raise RuntimeError("the reply names %d fds but carried %d" % (len(ret["fds"]), len(fds)))
        for entry, fd in zip(ret["fds"], fds):
            what = "vCPU %d" % entry["vcpu"] if "vcpu" in entry else "the VM"
            kind = "kvmscope-stats" if provider != "kvm" else ("kvm-vm-stats" if args["target"] == "vm" else "kvm-vcpu-stats")
            # What the fd is, before a byte of it is read: a read of another
            # kind of file may block for ever (/dev/kmsg).
            if not is_stats_kind(fd, kind):
                raise StatsError("the stats fd the VMM sent for %s (%s) is not a readable stats file (it is \"%s\", not %s); it was not read"
                                 % (what, provider, fd_target(fd), kind))
            try:
                out.append((entry, StatsFile(fd)))
            except (OSError, StatsError) as e:
                raise StatsError("the stats fd the VMM sent for %s (%s) is not a readable stats file (it is \"%s\"): %s"
                                 % (what, provider, fd_target(fd), e)) from None
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the VMM's control socket")
    p.add_argument("--vm", action="store_true", help="the VM's stats (default: VM and all vCPUs)")
    p.add_argument("--vcpu", type=vcpu_choice, help="a vCPU index or 'all'")
    p.add_argument("--names", type=names_choice,
                   help="only these stats, comma-separated; * matches any run of characters (e.g. halt_*)")
    p.add_argument("--provider", choices=["kvm", "kvmscope"], default="kvm",
                   help="KVM's stats (default) or the VMM's own, in KVM's format")
    p.add_argument("--json", action="store_true", help="print query-stats-shaped JSON")
    p.add_argument("--execute", metavar="JSON",
                   help="send this raw request and print the reply instead (events that come before it, "
                        "such as a scan's STOP and RESUME, are printed first, one line each)")
    p.add_argument("--timeout", type=seconds, default=30.0, help="seconds to wait for the VMM (more than 0)")
    a = p.parse_args()
    conn = Connection(a.socket, a.timeout)
    if a.execute:
        conn.sock.sendall(a.execute.encode() + b"\n")
        reply, fds = conn.read_line()
        while "event" in reply:  # events may come before the reply
            print(json.dumps(reply))
            reply, fds = conn.read_line()
        for fd in fds:
            os.close(fd)
        print(json.dumps(reply))
        return 0 if "return" in reply else 1
    vm, vcpu = a.vm, a.vcpu
    if not vm and vcpu is None:
        vm, vcpu = True, "all"
    sources = receive(conn, vm, vcpu, a.provider)
    conn.sock.close()  # from here on, everything comes from the kernel through the fds
    names = a.names
    results, seen = [], set()
    for entry, stats in sources:
        values = stats.read()
        os.close(stats.fd)
        kept = [n for n in values if names is None or any(m.fullmatch(n) for m in names.values())]
        seen.update(w for n in kept for w, m in (names or {}).items() if m.fullmatch(n))
        shown = [{"name": n, "value": values[n]} for n in kept]
        result = {"provider": a.provider, "target": entry["target"], "id": stats.id, "stats": shown}
        if "vcpu" in entry:
            result["vcpu"] = entry["vcpu"]
        results.append(result)
    missing = sorted(set(names) - seen) if names else []
    if missing:
        print("kvmscope_client: nothing matches in the stats read (provider %s): %s"
              % (a.provider, ", ".join(missing)), file=sys.stderr)
    if a.json:
        print(json.dumps({"return": results}))
        return 0
    for r in results:
        if not r["stats"]:
            continue
        print("== %s (%s) ==" % ("vcpu %d" % r["vcpu"] if "vcpu" in r else "vm", r["id"]))
        width = max((len(s["name"]) for s in r["stats"]), default=0)
        for s in r["stats"]:
            value = s["value"]
            print("%-*s  %s" % (width, s["name"], str(value).lower() if isinstance(value, bool) else value))
    return 0


def names_choice(text):
    """--names: {name or pattern: its regular expression}, in the order given."""
    out = {}
    for name in text.split(","):
        name = name.strip()
        if not name or not re.fullmatch(r"[A-Za-z0-9_*]+", name):
            raise argparse.ArgumentTypeError(
                "%r: use stat names, with * for any run of characters (e.g. halt_*)" % name)
        out[name] = re.compile(".*".join(re.escape(part) for part in name.split("*")))
    return out


def seconds(text):
    """--timeout: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("%r is not a number of seconds above 0" % text)
    return value


def vcpu_choice(text):
    """--vcpu: an index or 'all'."""
    if text == "all":
        return text
    try:
        index = int(text)
    except ValueError:
        index = -1
    if index < 0:
        raise argparse.ArgumentTypeError("%r is not a vCPU index (0, 1, ...) or 'all'" % text)
    return index


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, RuntimeError, StatsError, ValueError) as e:
        print("kvmscope_client: %s" % e, file=sys.stderr)
        sys.exit(1)
