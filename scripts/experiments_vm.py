"""A `kvmscope run --socket` child process for the experiments, and its
control-socket connections (scripts/kvmscope_client.py does the socket and fd
receiving). Every child dies with this process: PR_SET_PDEATHSIG covers even
SIGKILL, and `kill_all` ends the ones still open on the way out."""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from kvmscope_client import Connection

LIVE = set()  # VMs not yet closed
START = time.monotonic()


def log(msg):
    """A progress line on stderr, stamped with the seconds since the experiments began."""
    print("[%7.1fs] %s" % (time.monotonic() - START, msg), file=sys.stderr, flush=True)


HELD = {signal.SIGTERM, signal.SIGHUP}


def die_with_parent():
    """In the child before exec: SIGKILL when the parent dies, the stop
    signals back to their default and no longer held (`spawn` holds them)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    for sig in HELD:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def spawn(owner, args, **kwargs):
    """Starts `owner.proc`, a child that dies with this process, and puts
    `owner` among the children `kill_all` ends. SIGTERM and SIGHUP are held
    meanwhile: a `preexec_fn` makes Python fork, and a stop handler that
    raised in the fork's hooks (logging's lock release) was swallowed there
    ("Exception ignored"), so the script ran on; held, the signal is taken
    just after, with the child already known to `kill_all`."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        owner.proc = subprocess.Popen(args, preexec_fn=die_with_parent, **kwargs)
        LIVE.add(owner)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def kill_all():
    """Kills every VM not yet closed (on error or signal)."""
    for vm in list(LIVE):
        vm.proc.kill()
        vm.proc.wait()
        shutil.rmtree(vm.dir, ignore_errors=True)
    LIVE.clear()


def call(conn, execute, arguments):
    """Sends one request on `conn` and returns its value, skipping event lines
    (READINESS_PROGRESS and the like) that come before the reply."""
    conn.sock.sendall(json.dumps({"execute": execute, "arguments": arguments}).encode() + b"\n")
    return reply_of(conn, execute)


def reply_of(conn, execute):
    """The next reply on `conn` that is not an event; raises on an error reply."""
    while True:
        reply, fds = conn.read_line()
        for fd in fds:
            os.close(fd)
        if "event" not in reply:
            break
    if "error" in reply:
        raise RuntimeError("%s: %s: %s" % (execute, reply["error"]["class"], reply["error"]["desc"]))
    return reply["return"]


def shut_down(child, conn, *others):
    """Ends a `kvmscope run` child: `quit` on `conn`, every connection closed,
    the process waited for (killed after 20 s), its directory removed."""
    LIVE.discard(child)
    if conn is not None:
        try:
            call(conn, "quit", {})
        except (OSError, RuntimeError, ValueError):
            pass
    for c in (conn, *others):
        if c is not None:
            c.sock.close()
    try:
        child.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait()
    shutil.rmtree(child.dir, ignore_errors=True)


def unix_listening(path):
    """Whether a Unix socket is bound at `path` and listening: the path
    exists from its bind, and a connection before the listen is refused.
    /proc/net/unix sets __SO_ACCEPTCON (0x10000) in the flags of a listener."""
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7] == path and int(fields[3], 16) & 0x10000:
                return True
    return False


class Vm:
    """One `kvmscope run --socket` child, with a connection to it (and a
    second one, for commands sent while a reply is pending on the first)."""

    def __init__(self, binary, memory, hugepages=False, dirty_log=None, samples_out=None, sample_interval="off",
                 vcpus=1, extra=()):
        self.dir = tempfile.mkdtemp(prefix="kvmscope-exp-")
        self.socket = os.path.join(self.dir, "ctl.sock")
        # What a destination needs to build the same VM before it listens.
        self.shape = ["--memory", memory, "--vcpus", str(vcpus)]
        self.shape += ["--hugepages"] if hugepages else []
        self.shape += ["--dirty-log", dirty_log] if dirty_log else []
        args = [binary, "run", "--socket", self.socket, "--sample-interval", sample_interval] + self.shape
        args += ["--samples-out", samples_out] if samples_out else []
        args += list(extra)
        self.log_path = os.path.join(self.dir, "run.log")
        with open(self.log_path, "w") as out:
            spawn(self, args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.conn = self.side_conn = None
        try:
            self.conn = self._connect(time.monotonic() + 30)
            info = self.call("query-vm")
        except BaseException:
            self.close()
            raise
        self.arena = next(r for r in info["memory"]["layout"] if r["name"] == "arena")
        self.backend = info["backend"]

    def _connect(self, deadline):
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("kvmscope run exited with %s before serving:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                return Connection(self.socket, 900)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise RuntimeError("kvmscope run did not serve %s within 30 s" % self.socket)
                time.sleep(0.01)

    def log_tail(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def call(self, execute, /, **arguments):
        return call(self.conn, execute, arguments)

    def side(self, execute, /, **arguments):
        """`call` on the second connection."""
        if self.side_conn is None:
            self.side_conn = Connection(self.socket, 900)
        return call(self.side_conn, execute, arguments)

    def wait_calibrated(self, limit=30.0):
        """Waits (bounded) until the VMM has measured its cost per fault
        (`query-vm`'s `fault-cost`; a few seconds after its start): a stall
        measured before is priced at the default, several times off on
        some hosts."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            cost = self.call("query-vm").get("fault-cost") or {}
            if cost.get("source", "measured") != "default":
                return
            time.sleep(0.1)
        log("the VMM at %s did not measure its cost per fault within %.0f s" % (self.socket, limit))

    def guest(self, command, vcpu=0):
        """Runs workload commands to the end; their results (each checked ok)."""
        results = self.call("guest-command", vcpu=vcpu, command=command, wait=True)["results"]
        for r in results:
            if r["status"] != "ok":
                raise RuntimeError("guest command %r: %s" % (r["command"], r["status"]))
        return results

    def start(self, command, vcpu=0, side=False):
        """Queues a workload command without waiting; its sequence number."""
        send = self.side if side else self.call
        return send("guest-command", vcpu=vcpu, command=command)["last-seq"]

    def wait_running(self, seq, vcpu=0, limit=10.0):
        """Waits (bounded) until the vCPU runs command `seq` or has finished it."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            g = self.call("query-guest", vcpus=[vcpu])[0]
            last = g.get("last-result") or {}
            if g["state"] == "running" or last.get("seq", 0) >= seq:
                return
            time.sleep(0.002)
        raise RuntimeError("command %d did not start within %.0f s" % (seq, limit))

    def result(self, seq, vcpu=0, limit=120.0):
        """Waits (bounded) for the result of command `seq`, the vCPU's latest."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            last = self.call("query-guest", vcpus=[vcpu])[0].get("last-result") or {}
            if last.get("seq") == seq:
                if last["status"] != "ok":
                    raise RuntimeError("guest command %r: %s" % (last["command"], last["status"]))
                return last
            time.sleep(0.01)
        raise RuntimeError("no result for command %d within %.0f s" % (seq, limit))

    def readiness(self, scan, calc_time=0.0):
        # The VMM may answer a measurement a moment before it takes the next
        # one, so "already running" right after a reply is retried (bounded).
        for attempt in range(100):
            try:
                return self.call("query-readiness", scan=scan, **{"calc-time": calc_time})
            except RuntimeError as e:
                if "already running" not in str(e) or attempt == 99:
                    raise
                time.sleep(0.01)

    def send_readiness(self, scan, calc_time):
        """Sends `query-readiness` without waiting; `readiness_reply` reads it."""
        req = {"execute": "query-readiness", "arguments": {"scan": scan, "calc-time": calc_time}}
        self.conn.sock.sendall(json.dumps(req).encode() + b"\n")

    def readiness_reply(self):
        return reply_of(self.conn, "query-readiness")

    def close(self):
        """Quits the VMM (killing it if it does not end) and removes its directory."""
        shut_down(self, getattr(self, "conn", None), self.side_conn)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
