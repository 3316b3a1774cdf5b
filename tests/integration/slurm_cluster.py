"""A real Slurm cluster on the network-namespace hosts of netns.py: slurmctld on host 0, one
slurmd on every host (its own host name, spool, PMIx directory and cgroup mounts), no
authentication daemon (auth/none), so that the scripts in scripts/slurm/ run as the README
writes them, `--nodes=2` included, across host boundaries.

    with netns.Cluster(2, "slurm") as hosts, Slurm(hosts, workdir) as slurm:
        rc, out = slurm.sbatch(["--ntasks=6", "scripts/slurm/parameter_server.sbatch"],
                               env={"JOB": ...})

What bites on this machine: slurmd initialises its cgroup plugin even with proctrack/pgid, and
refuses the host's hybrid cgroup layout, so each slurmd runs in its own mount namespace with
the v1 hierarchies it looks for mounted on a tmpfs; the hosts share /tmp, where PMIx would put
every node's directory under the same name, so each node gets its own mpi.conf
(PMIxCliTmpDirBase) beside an identical slurm.conf; nodes claim 16 CPUs
(SlurmdParameters=config_overrides) so that the scripts' --cpus-per-task fit on a 2-core
machine."""
import os
import shutil
import subprocess
import time

CPUS = 16
CGROUPS = ("freezer", "cpuset", "memory", "devices")


def slurm_possible():
    """(True, "") when slurmctld, slurmd and sbatch are installed."""
    missing = [b for b in ("slurmctld", "slurmd", "sbatch", "sinfo") if not shutil.which(b)]
    if missing:
        return False, (f"Slurm is not installed ({', '.join(missing)} missing): "
                       "scripts/setup.sh --tests installs slurmctld, slurmd and slurm-client")
    return True, ""


def _conf(hosts, workdir):
    nodes = "\n".join(f"NodeName={h} NodeAddr={hosts.addr(i)} CPUs={CPUS} State=UNKNOWN"
                      for i, h in enumerate(hosts.hosts))
    return f"""ClusterName=ctrain
SlurmctldHost={hosts.hosts[0]}({hosts.addr(0)})
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool-%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd-%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class Slurm:
    """slurmctld and the slurmds as processes of the hosts; stopped on exit (the namespaces'
    own cleanup kills whatever is left)."""

    def __init__(self, hosts, workdir):
        self.hosts, self.dir = hosts, str(workdir)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.procs = []

    def env(self, extra=None):
        return dict(os.environ, SLURM_CONF=self.conf, **(extra or {}))

    def __enter__(self):
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        text = _conf(self.hosts, self.dir)
        with open(self.conf, "w") as f:
            f.write(text)
        self.procs.append(self._start(0, "slurmctld", ["slurmctld", "-D"], self.conf))
        for i, h in enumerate(self.hosts.hosts):
            node = os.path.join(self.dir, h)
            os.makedirs(os.path.join(node, "pmix"), exist_ok=True)
            os.makedirs(os.path.join(self.dir, f"spool-{h}"), exist_ok=True)
            with open(os.path.join(node, "slurm.conf"), "w") as f:
                f.write(text)
            with open(os.path.join(node, "mpi.conf"), "w") as f:
                f.write(f"PMIxCliTmpDirBase={node}/pmix\n")
            mounts = "mount -t tmpfs none /sys/fs/cgroup && " + " && ".join(
                f"mkdir -p /sys/fs/cgroup/{c} && mount -t cgroup -o {c} none /sys/fs/cgroup/{c}"
                for c in CGROUPS) + (" && mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o "
                                     "none,name=systemd none /sys/fs/cgroup/systemd")
            self.procs.append(self._start(i, f"slurmd-{h}", [
                "unshare", "--mount", "sh", "-c", f'{mounts} && exec slurmd -D -N "$0"', h],
                os.path.join(node, "slurm.conf")))
        self._wait_idle(60)
        return self

    def _start(self, host, name, argv, conf):
        log = open(os.path.join(self.dir, f"{name}.out"), "w")
        return self.hosts.popen(host, argv, env=dict(os.environ, SLURM_CONF=conf), stdout=log,
                                stderr=subprocess.STDOUT)

    def _wait_idle(self, timeout):
        deadline, out = time.time() + timeout, ""
        while time.time() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited ({p.args}): see {self.dir}/*.out")
            r = self.hosts.run(0, ["sinfo", "-h", "-N", "-o", "%N %t"], timeout=30,
                               env=self.env())
            out = r.stdout
            states = [line.split()[1] for line in out.splitlines() if line.strip()]
            if len(states) == len(self.hosts.hosts) and all(s == "idle" for s in states):
                return
            time.sleep(0.5)
        raise RuntimeError(f"Slurm nodes not idle after {timeout} s:\n{out}\n"
                           f"(logs in {self.dir})")

    def sbatch(self, argv, env=None, cwd=None, timeout=600):
        """Submits a batch script from host 0 and waits for it (sbatch --wait): (exit code,
        the job's output)."""
        out = os.path.join(self.dir, f"job-{time.monotonic_ns()}.out")
        r = self.hosts.run(0, ["sbatch", "--wait", f"--output={out}", *argv], timeout=timeout,
                           env=self.env(env), cwd=cwd)
        text = open(out).read() if os.path.exists(out) else ""
        return r.returncode, r.stdout + r.stderr + text

    def submit(self, argv, output, env=None, cwd=None):
        """Submits without waiting; the job id."""
        r = self.hosts.run(0, ["sbatch", "--parsable", f"--output={output}", *argv],
                           timeout=60, env=self.env(env), cwd=cwd)
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed: {r.stdout}{r.stderr}")
        return r.stdout.strip().split(";")[0]

    def scontrol(self, *args):
        return self.hosts.run(0, ["scontrol", *args], timeout=60, env=self.env())

    def wait_gone(self, job, timeout):
        """Waits until the job has left the queue (finished, failed or cancelled); its final
        state from `scontrol show job` (kept MinJobAge seconds), or "" if already forgotten."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = self.scontrol("show", "job", job)
            state = (r.stdout.split("JobState=")[1].split()[0] if "JobState=" in r.stdout
                     else "")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED",
                             "REQUEUE_HOLD", "REQUEUE_FED"):
                return state
            time.sleep(0.5)
        raise RuntimeError(f"job {job} still queued after {timeout} s")

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return False
