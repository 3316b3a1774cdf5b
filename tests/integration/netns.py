"""Hosts made of network namespaces, for the multi-host tests (see
../shared/reference/hosts-on-one-machine.md): N namespaces joined by veth pairs on one bridge,
each with its own address (10.77.S.i+1/24), host name (`host0`, `host1`, ...) and /etc/hosts
view (through /etc/netns/NS/hosts), in which its OWN name maps to 127.0.1.1 as on stock Debian
(the trap every role must survive) and the other hosts' names to their addresses. The bridge
itself has 10.77.S.254, so processes outside the namespaces (mpirun) reach the hosts.

    with Cluster(3, "ps") as c:
        p = c.popen(1, [binary, ...], stdout=...)     # subprocess.Popen in host 1
        r = c.run(0, ["sinfo"], timeout=30)           # subprocess.run, output captured as text
        c.addr(1), c.hosts[1]                         # "10.77.S.2", "host1"
        c.kill_host(2)                                # SIGKILL every process of host 2 at once
        c.link(2, up=False)                           # a cut link (and up=True to mend it)
        c.cap(2, "10mbit")                            # a bandwidth cap on host 2's link
        c.mpirun_args(2) / c.mpirun_env()             # mpirun with ranks on the hosts

Everything is removed on exit, on an exception, at interpreter exit and after SIGTERM; a new
Cluster also removes what a crashed run of another process left (names carry its pid).
`python3 netns.py up N | down | exec I CMD...` does the same for people (scripts/netns_cluster.sh).
"""
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
AGENT = os.path.join(ROOT, "scripts", "netns_agent.sh")
PREFIX = "ctn"  # namespaces ctn<pid>h<i>, bridge ctn<pid>br, veths ctn<pid>v<i>


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


def namespaces_possible():
    """(True, "") when this process can make namespaces, veth pairs and a bridge."""
    if os.geteuid() != 0:
        return False, "network namespaces need root (the multi-host tests run as root in CI)"
    for tool in ("ip", "unshare", "tc"):
        if not shutil.which(tool):
            return False, f"'{tool}' is not installed (iproute2, util-linux)"
    name = f"{PREFIX}{os.getpid()}probe"
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return False, f"cannot make a network namespace here: {r.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return True, ""


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove(pid):
    """Removes every namespace, link and hosts file of the cluster(s) made by process pid."""
    tag = f"{PREFIX}{pid}"
    names = [l.split()[0] for l in _ip("netns", "list", check=False).stdout.splitlines()
             if l.startswith(tag)]
    for ns in names:
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        for _ in range(50):  # the killed processes leave the namespace as they are reaped
            if not _ip("netns", "pids", ns, check=False).stdout.split():
                break
            time.sleep(0.1)
        _ip("netns", "del", ns, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    links = _ip("-o", "link", "show", check=False).stdout
    for name in re.findall(rf"^\d+: ({tag}\w+)[@:]", links, re.M):
        _ip("link", "del", name, check=False)


def _remove_stale():
    """What clusters of processes that no longer exist left behind."""
    seen = set()
    listing = _ip("netns", "list", check=False).stdout + _ip("-o", "link", "show",
                                                              check=False).stdout
    for pid in re.findall(rf"\b{PREFIX}(\d+)(?:h|v|br|probe)", listing):
        if pid not in seen and not _alive(int(pid)):
            seen.add(pid)
            _remove(int(pid))


_live = []


def _cleanup_all():
    for c in list(_live):
        c.close()


def _on_term(signum, frame):
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_cleanup_all)


class Cluster:
    def __init__(self, n_hosts, tag="", subnet=None):
        self.n, self.tag = n_hosts, tag
        self.pid = os.getpid()
        self.id = f"{PREFIX}{self.pid}"
        self.subnet = subnet if subnet is not None else 100 + self.pid % 100
        self.hosts = [f"host{i}" for i in range(n_hosts)]
        self.ns = [f"{self.id}h{i}" for i in range(n_hosts)]
        self.bridge = f"{self.id}br"
        self.map_file = f"/tmp/{self.id}.hostmap"
        self.open = False

    def addr(self, i):
        return f"10.77.{self.subnet}.{i + 1}"

    @property
    def bridge_addr(self):
        return f"10.77.{self.subnet}.254"

    @property
    def cidr(self):
        return f"10.77.{self.subnet}.0/24"

    def __enter__(self):
        _remove_stale()
        _remove(self.pid)  # an earlier cluster of this process that was not closed
        _live.append(self)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_term)
        self.open = True
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def _make(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_addr}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.ns):
            _ip("netns", "add", ns)
            outer, inner = f"{self.id}v{i}", f"{self.id}p{i}"
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            lines = ["127.0.0.1 localhost", f"127.0.1.1 {self.hosts[i]}",
                     f"{self.bridge_addr} bridge"]
            lines += [f"{self.addr(j)} {h}" for j, h in enumerate(self.hosts) if j != i]
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write("\n".join(lines) + "\n")
        with open(self.map_file, "w") as f:
            f.write("".join(f"{h} {ns}\n" for h, ns in zip(self.hosts, self.ns)))

    def close(self):
        if not self.open:
            return
        self.open = False
        _remove(self.pid)
        try:
            os.unlink(self.map_file)
        except FileNotFoundError:
            pass
        if self in _live:
            _live.remove(self)

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- processes ----

    def argv(self, i, argv):
        """argv run in host i, with its host name."""
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c",
                f'hostname {self.hosts[i]} && exec "$@"', "sh", *argv]

    def popen(self, i, argv, **kw):
        return subprocess.Popen(self.argv(i, argv), **kw)

    def run(self, i, argv, timeout, **kw):
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.argv(i, argv), timeout=timeout, **kw)

    def kill_host(self, i):
        """Every process of host i killed at once: a lost host."""
        for p in _ip("netns", "pids", self.ns[i], check=False).stdout.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def link(self, i, up):
        """Cuts (up=False) or mends host i's link to the bridge."""
        _ip("link", "set", f"{self.id}v{i}", "up" if up else "down")

    def cap(self, i, rate, burst="64kb", latency="50ms"):
        """A token-bucket bandwidth cap on host i's link, both ways (rate None: no cap)."""
        for dev, where in ((f"{self.id}v{i}", []), ("eth0", ["-n", self.ns[i]])):
            subprocess.run(["tc", *where, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, timeout=30)
            if rate:
                r = subprocess.run(["tc", *where, "qdisc", "add", "dev", dev, "root", "tbf",
                                    "rate", rate, "burst", burst, "latency", latency],
                                   capture_output=True, text=True, timeout=30)
                if r.returncode != 0:
                    raise RuntimeError(f"tc tbf on {dev}: {r.stderr.strip()}")

    # ---- Open MPI ----

    def mpirun_args(self, ranks_per_host, hosts=None):
        hosts = range(self.n) if hosts is None else hosts
        spec = ",".join(f"{self.hosts[i]}:{ranks_per_host}" for i in hosts)
        return ["--host", spec, "--mca", "plm_rsh_agent", AGENT,
                "--mca", "oob_tcp_if_include", self.cidr, "--mca", "btl_tcp_if_include",
                self.cidr, "--mca", "btl", "tcp,self,vader"]

    def mpirun_env(self):
        return {"CT_NETNS_MAP": self.map_file, "HWLOC_COMPONENTS": "-gl",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def _main(argv):
    """up N (stays up until Ctrl-C or `down`), down, exec I CMD..."""
    if not argv or argv[0] not in ("up", "down", "exec"):
        print("usage: netns.py up N | down | exec HOSTINDEX CMD...", file=sys.stderr)
        return 2
    state = "/tmp/ctn-cli.pid"
    if argv[0] == "up":
        ok, why = namespaces_possible()
        if not ok:
            print(f"netns: {why}", file=sys.stderr)
            return 1
        with Cluster(int(argv[1]) if len(argv) > 1 else 2, "cli") as c:
            with open(state, "w") as f:
                f.write(f"{os.getpid()} {c.subnet} {c.n}\n")
            for i in range(c.n):
                print(f"{c.hosts[i]} {c.addr(i)} (ip netns exec {c.ns[i]} ...)")
            print(f"bridge {c.bridge_addr}; `netns.py down` or Ctrl-C removes it all")
            try:
                signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
                while True:
                    time.sleep(3600)
            except (KeyboardInterrupt, SystemExit):
                pass
        os.unlink(state)
        return 0
    if not os.path.exists(state):
        print("netns: no cluster is up (netns.py up N)", file=sys.stderr)
        return 1
    pid, subnet, n = (int(x) for x in open(state).read().split())
    if argv[0] == "down":
        os.kill(pid, signal.SIGTERM)
        return 0
    c = Cluster(n, subnet=subnet)
    c.pid, c.id = pid, f"{PREFIX}{pid}"
    c.ns = [f"{c.id}h{i}" for i in range(n)]
    return subprocess.call(c.argv(int(argv[1]), argv[2:]))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
