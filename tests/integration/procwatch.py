"""Watching processes that may be gone by the next line. A test that stops or kills one rank,
role or data worker of a run finds it by a scan (it is a child of mpirun or of a ctrain
launcher, not of the test), and that process may exit at any moment: its /proc entry vanishes
(FileNotFoundError, ProcessLookupError, or PermissionError while it is torn down), and once its
parent reaps it, its pid may be given to a new process (pid_max is 32768 here). So every read of
/proc below tolerates a process that is gone, a process is pinned by a pidfd (Linux 5.3; the pid
and its start time where there are none) before it is checked and signalled, and a signal never
reaches a process that merely took over the pid. The waits poll what the run writes (a logged
step in metrics.jsonl, a checkpoint) and are bounded; none is a fixed sleep."""
import json
import os
import re
import signal
import subprocess
import time

GONE = (FileNotFoundError, ProcessLookupError, PermissionError)


def _read(path):
    """The bytes of a /proc file, or None when its process is gone (or no longer ours)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except GONE:
        return None


def _stat(pid):
    """(ppid, state, start time in clock ticks) of pid from /proc/PID/stat, or None."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    rest = data[data.rfind(b")") + 2:].split()  # after "pid (comm) ": field 3 onwards
    try:
        return int(rest[1]), rest[0].decode(), int(rest[19])
    except (IndexError, ValueError):
        return None


class Process:
    """One process, pinned: its pid, its start time (a new process on the same pid has
    another) and a pidfd where the kernel has them."""

    def __init__(self, pid, start, fd):
        self.pid, self.start, self.fd = pid, start, fd

    @classmethod
    def pin(cls, pid):
        """The process at pid now, or None if there is none."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except (AttributeError, OSError):  # no pidfds (old kernel or Python): pid + start time
            fd = None
        st = _stat(pid)
        p = cls(pid, st[2] if st else None, fd)
        # the stat read is the pinned process's only if that one still lives after it
        if st is None or not p.alive():
            p.close()
            return None
        return p

    def alive(self):
        """Not reaped yet (a zombie is alive here: see gone)."""
        if self.fd is not None:
            try:
                signal.pidfd_send_signal(self.fd, 0)
                return True
            except ProcessLookupError:
                return False
        st = _stat(self.pid)
        return st is not None and st[2] == self.start

    def gone(self):
        """True once the process has exited: reaped, a zombie, or its pid taken by another."""
        if not self.alive():
            return True
        st = _stat(self.pid)
        return st is None or st[2] != self.start or st[1] in ("Z", "X")

    def environ(self):
        """Its environment as a list of b"NAME=value", or None once it is gone."""
        data = _read(f"/proc/{self.pid}/environ")
        if data is None or not self.alive():
            return None
        return data.split(b"\0")

    def cmdline(self):
        """Its command line joined by spaces (as pgrep -f matches it), or None once gone."""
        data = _read(f"/proc/{self.pid}/cmdline")
        if data is None or not self.alive():
            return None
        return data.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")

    def send(self, sig):
        """Sends sig to this process; False when it had exited (nothing was signalled)."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif self.alive():
                os.kill(self.pid, sig)  # without pidfds a tiny window remains
            else:
                return False
            return True
        except ProcessLookupError:
            return False

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self):
        self.close()

    def __repr__(self):
        return f"Process({self.pid})"


def children(ppid, needle=None):
    """The live (not zombie) children of ppid whose command line contains needle, pinned; a
    process that exits during the scan is left out."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is None or st[0] != ppid or st[1] in ("Z", "X"):
            continue
        p = Process.pin(int(name))
        if p is None:
            continue
        st = _stat(p.pid)  # the pinned process is the child seen above (not a new one)
        if st is None or st[0] != ppid or st[2] != p.start:
            p.close()
            continue
        if needle is not None and needle not in (p.cmdline() or ""):
            p.close()
            continue
        found.append(p)
    return found


def wait_until(check, proc=None, timeout=120, poll=0.05):
    """check()'s first true value, polled until timeout seconds pass or proc (a Popen) ends;
    None then."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            return check() or None
        time.sleep(poll)


def wait_for_children(ppid, needle, count, proc=None, timeout=120):
    """At least count children of ppid matching needle, waiting while proc runs; what was found
    (fewer when the wait ran out)."""
    last = []

    def enough():
        nonlocal last
        last = [p for p in children(ppid, needle)]
        return last if len(last) >= count else None
    return wait_until(enough, proc, timeout) or last


def signal_child(ppid, needle, sig, proc=None, timeout=120, where=None):
    """Sends sig to a child of ppid whose command line contains needle and for which where(p)
    is true (any, without where), scanning again while candidates exit under it; the Process
    signalled, or None when there was none within timeout (or proc ended)."""
    def attempt():
        for p in children(ppid, needle):
            if (where is None or where(p)) and p.send(sig):
                return p
        return None
    return wait_until(attempt, proc, timeout)


def environ_has(entry):
    """A where= for signal_child: the process's environment holds entry (b"NAME=value")."""
    return lambda p: entry in (p.environ() or ())


def logged_step(run_dir):
    """The largest step in RUN_DIR/metrics.jsonl (the run's logged steps), or None. A line still
    being written is not read."""
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    step = None
    for line in data.split(b"\n")[:-1]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            step = max(step or 0, record["step"])
    return step


def ckpt_step(run_dir):
    """The step of the checkpoint RUN_DIR/checkpoints/checkpoint names (the latest one), or
    None before the first."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "checkpoint")) as f:
            m = re.search(r"ckpt-(\d+)\.ctck", f.readline())
    except FileNotFoundError:
        return None
    return int(m.group(1)) if m else None


def wait_for_step(run_dir, step, proc=None, timeout=120, read=logged_step):
    """Waits until read(run_dir) (logged_step or ckpt_step) reaches step while proc runs;
    that step, or None when proc ended or timeout passed first."""
    def reached():
        s = read(run_dir)
        return s if s is not None and s >= step else None
    return wait_until(reached, proc, timeout)


def end(proc, grace=60):
    """After a failed check: stops proc if it still runs (SIGTERM, which a launcher passes on to
    its processes; SIGKILL after `grace` seconds) and reaps it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
