"""Hosts made of network namespaces, for the multi-host tests (see
../shared/reference/hosts-on-one-machine.md): N namespaces joined by veth pairs on one bridge,
each with its own addresses (10.77.S.i+1/24 and fd77:S::i+1/64), host name (`host0`, `host1`,
...) and /etc/hosts view (through /etc/netns/NS/hosts), in which its OWN name maps to 127.0.1.1
as on stock Debian (the trap every role must survive) and the other hosts' names to their IPv4
addresses. The bridge
itself has 10.77.S.254 (named `bridge` in the hosts' /etc/hosts), so processes outside the
namespaces (mpirun) reach the hosts. S is a subnet no other cluster on the machine uses.

    ok, why = namespaces_possible()                   # (False, one line) without root/iproute2
    with Cluster(3, "ps") as c:
        p = c.popen(1, [binary, ...], stdout=...)     # subprocess.Popen in host 1
        r = c.run(0, ["sinfo"], timeout=30)           # subprocess.run, output captured as text
        c.argv(1, [binary, ...])                      # the command line popen/run use
        c.addr(1), c.hosts[1], c.ns[1], c.cidr        # "10.77.S.2", "host1", namespace, subnet
        c.addr6(1)                                    # "fd77:S::2"
        c.kill_host(2)                                # SIGKILL every process of host 2 at once
        c.link(2, up=False)                           # a cut link (and up=True to mend it)
        c.cap(2, "10mbit")                            # a bandwidth cap on host 2's link (None: off)
        subprocess.run(["mpirun", "-np", "4", *c.mpirun_args(2), binary, ...],
                       env=dict(os.environ, **c.mpirun_env()))   # 2 ranks on each host

Processes in a host run under `ip netns exec NS unshare --uts`, with the host's name set, so
gethostname() differs per host. mpirun_args(ranks_per_host, hosts=None) starts the ranks
through scripts/netns_agent.sh (an rsh agent that reads the host map named by CT_NETNS_MAP,
which mpirun_env() sets with HWLOC_COMPONENTS=-gl and the run-as-root switches). mpirun_env()
leaves Open MPI's mpi_yield_when_idle alone, so a test sees the product's own default:
spinning ranks starve the veth links (about 4 ms a message), so set
OMPI_MCA_mpi_yield_when_idle=1 for MPI programs that do not choose it themselves.

Everything is removed on exit, on an exception, at interpreter exit and after SIGTERM or
SIGHUP; a new Cluster also removes what a crashed process left (names carry its pid:
ctn<pid>h<i>, ctn<pid>c<k>h<i> for a process's later clusters, which may be open together).
`python3 netns.py up N | down | exec I CMD... | mpirun RANKS_PER_HOST PROGRAM...` does the
same for people (scripts/netns_cluster.sh; `up` returns once the hosts are up).
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
# names carry the creating process's pid and a per-process count: namespaces ctn<pid>[c<k>]h<i>,
# bridge ctn<pid>[c<k>]br, veths ctn<pid>[c<k>]v<i> (15 characters at most with pid_max 4194304)
PREFIX = "ctn"
_STALE = re.compile(rf"\b{PREFIX}(\d+)(?:c\d+)?(?:h|v|p|br|probe)")


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
    for kind, args in (("bridge", ["type", "bridge"]),
                       ("veth pair", ["type", "veth", "peer", "name", name + "x"])):
        r = _ip("link", "add", name, *args, check=False)
        if r.returncode != 0:
            return False, f"cannot make a {kind} here: {r.stderr.strip()}"
        _ip("link", "del", name, check=False)
    return True, ""


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _remove(tag):
    """Removes every namespace, link, hosts file and host map whose name starts with tag
    ("ctn<pid>" for everything of a process, "ctn<pid>c<k>" for one of its clusters)."""
    mine = re.compile(rf"{tag}(?:h|v|p|br|probe)" if "c" in tag[len(PREFIX):]
                      else rf"{tag}(?:c\d+)?(?:h|v|p|br|probe)")
    names = [l.split()[0] for l in _ip("netns", "list", check=False).stdout.splitlines()
             if mine.match(l)]
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
    for name in re.findall(r"^\d+: (\w+)[@:]", links, re.M):
        if mine.match(name):
            _ip("link", "del", name, check=False)
    for name in os.listdir("/tmp"):
        if name.endswith(".hostmap") and mine.match(name[:-len(".hostmap")] + "h"):
            try:
                os.unlink(os.path.join("/tmp", name))
            except FileNotFoundError:
                pass


def _remove_stale():
    """What clusters of processes that no longer exist left behind."""
    seen = set()
    listing = (_ip("netns", "list", check=False).stdout + _ip("-o", "link", "show",
                                                               check=False).stdout
               + " ".join(n[:-len(".hostmap")] + "h" for n in os.listdir("/tmp")
                          if n.endswith(".hostmap")))
    for pid in _STALE.findall(listing):
        if pid not in seen and not _alive(int(pid)):
            seen.add(pid)
            _remove(f"{PREFIX}{pid}")


_live = []


def _cleanup_all():
    for c in list(_live):
        c.close()


def _on_term(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    _cleanup_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_cleanup_all)


class Cluster:
    """n_hosts hosts host0.. on one bridge; `with Cluster(n) as c:` makes them, leaving removes
    them. tag only names the cluster in messages; subnet (the S of 10.77.S.0/24) is chosen free
    unless given."""
    _count = 0  # clusters this process made: the k of ctn<pid>c<k>

    def __init__(self, n_hosts, tag="", subnet=None):
        self.n, self.tag = n_hosts, tag
        self.pid = os.getpid()
        k, Cluster._count = Cluster._count, Cluster._count + 1
        self.id = f"{PREFIX}{self.pid}" + (f"c{k}" if k else "")
        self.subnet = subnet
        self.hosts = [f"host{i}" for i in range(n_hosts)]
        self.ns = [f"{self.id}h{i}" for i in range(n_hosts)]
        self.bridge = f"{self.id}br"
        self.map_file = f"/tmp/{self.id}.hostmap"
        self.open = False

    def addr(self, i):
        return f"10.77.{self.subnet}.{i + 1}"

    def addr6(self, i):
        """Host i's IPv6 address (fd77:S::i+1/64, on the same link)."""
        return f"fd77:{self.subnet}::{i + 1}"

    @property
    def bridge_addr(self):
        return f"10.77.{self.subnet}.254"

    @property
    def cidr(self):
        return f"10.77.{self.subnet}.0/24"

    def __enter__(self):
        _remove_stale()
        _remove(self.id)
        _live.append(self)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_term)
        self.open = True
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def _free_subnet(self):
        """The S of a 10.77.S.0/24 that no address here uses, from 100 + pid % 100 on."""
        used = {int(x) for x in re.findall(r"inet 10\.77\.(\d+)\.",
                                           _ip("-o", "-4", "addr", "show", check=False).stdout)}
        for d in range(253):
            s = 1 + (99 + self.pid % 100 + d) % 253
            if s not in used:
                return s
        raise RuntimeError("netns: every 10.77.S.0/24 is in use")

    def _make(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        if self.subnet is None:
            self.subnet = self._free_subnet()
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
            # nodad: usable at once, not after duplicate address detection's second or two
            _ip("-n", ns, "addr", "add", f"{self.addr6(i)}/64", "dev", "eth0", "nodad")
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
        _remove(self.id)  # also the host map
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


STATE = "/tmp/ctn-cli.state"  # the command line's cluster: keeper pid, id, subnet, hosts


def _cli_cluster():
    """The cluster `up` made (its keeper process still alive), or None."""
    try:
        pid, cid, subnet, n = open(STATE).read().split()
    except (FileNotFoundError, ValueError):
        return None
    if not _alive(int(pid)):
        return None
    c = Cluster(int(n), "cli", subnet=int(subnet))
    c.pid, c.id = int(pid), cid
    c.ns = [f"{cid}h{i}" for i in range(c.n)]
    c.bridge, c.map_file = f"{cid}br", f"/tmp/{cid}.hostmap"
    return c


def _up(n):
    """Forks a keeper that makes the cluster and holds it until `down` (SIGTERM); prints the
    hosts once they are up."""
    ok, why = namespaces_possible()
    if not ok:
        print(f"netns: {why}", file=sys.stderr)
        return 1
    if _cli_cluster():
        print("netns: a cluster is up already (netns.py down first)", file=sys.stderr)
        return 1
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        os.setsid()
        try:
            with Cluster(n, "cli") as c:
                signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
                with open(STATE, "w") as f:
                    f.write(f"{os.getpid()} {c.id} {c.subnet} {c.n}\n")
                lines = [f"{c.hosts[i]} {c.addr(i)} (namespace {c.ns[i]})" for i in range(n)]
                lines.append(f"bridge {c.bridge_addr} ({c.cidr}); `netns.py down` removes it")
                os.write(w, ("\n".join(lines) + "\n").encode())
                os.close(w)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                while True:
                    signal.pause()
        except SystemExit:
            pass
        except BaseException as e:  # before the hosts were up: the parent says why
            os.write(w, f"netns: {e}\n".encode())
        finally:
            if os.path.exists(STATE) and open(STATE).read().split()[:1] == [str(os.getpid())]:
                os.unlink(STATE)
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    sys.stdout.write(text)
    return 1 if not text or text.startswith("netns:") else 0


def _main(argv):
    """up N | down | exec I CMD... | mpirun RANKS_PER_HOST PROGRAM..."""
    usage = ("usage: netns.py up N | down | exec HOSTINDEX CMD... | "
             "mpirun RANKS_PER_HOST PROGRAM ARGS...")
    if not argv or argv[0] not in ("up", "down", "exec", "mpirun"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "up":
        return _up(int(argv[1]) if len(argv) > 1 else 2)
    c = _cli_cluster()
    if argv[0] == "down":
        if c:
            os.kill(c.pid, signal.SIGTERM)
            for _ in range(100):
                if not _alive(c.pid):
                    break
                time.sleep(0.1)
            _remove(c.id)
        _remove_stale()
        return 0
    if not c:
        print("netns: no cluster is up (netns.py up N)", file=sys.stderr)
        return 1
    if len(argv) < 3:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "exec":
        return subprocess.call(c.argv(int(argv[1]), argv[2:]))
    per = int(argv[1])
    return subprocess.call(["mpirun", "-np", str(per * c.n), *c.mpirun_args(per), *argv[2:]],
                           env=dict(os.environ, **c.mpirun_env()))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
