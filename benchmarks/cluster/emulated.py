"""An emulated cluster on this machine: hosts as network namespaces behind one switch, links shaped by tc.

Why this exists: the planner chooses between strategies by the network a job
runs on, and one machine's loopback has no network to speak of. This module
builds 2 to 4 "hosts", each a Linux network namespace with its own address,
joined through a bridge, each host's link limited by a token bucket (`tc`
`tbf`, both directions) and each host pinned to its share of the cores
(`taskset`); torchrun runs one agent per host and meets at a c10d
rendezvous on host 0.

    python benchmarks/cluster/emulated.py up --hosts 2 --bandwidth 1gbit        # hold it until Ctrl-C
    python benchmarks/cluster/emulated.py torchrun --hosts 2 --bandwidth 10gbit -- -m gnnc run PLAN
    python benchmarks/cluster/emulated.py probe --hosts 2 --bandwidth 1gbit -o cluster.json
    python benchmarks/cluster/emulated.py cleanup       # what a SIGKILLed run left behind

Layout. Everything lives in namespaces named `gnnc-c<pid>-<hex>-...` (the pid of
the process that built it, and a random part): the switch namespace `...-sw` holds the bridge
`br0` and one veth end per host (`h0`, `h1`, ...); host k's namespace
`...-h<k>` holds the other end as `eth0` with address 10.213.0.<k+1>/24 and
its own `lo`. No interface, address or route is added to the machine's own
namespace, so nothing of the cluster can collide with another user's
interfaces, and its traffic cannot leave the namespaces (the bridge has no
address and no uplink).

Links. A tbf qdisc on both ends of each host's veth pair shapes what the host
sends and what it receives to `--bandwidth`. Latency: this needs netem
(`tc qdisc ... netem delay`); `--delay` adds it where the kernel has netem and
is refused with the reason where it has not (the kernel this was written on
has tbf and htb but neither netem nor fq, so the emulated links add no
latency beyond the veth path's own).

Teardown. Every process started in a host runs inside its namespace, so
teardown stops whatever `ip netns pids` lists there (SIGTERM, then SIGKILL),
then deletes the namespaces, which deletes their interfaces. It runs on
normal exit, on an exception, and on SIGINT, SIGTERM or SIGHUP (turned into
an exception by `stop_on_signals`). A SIGKILLed builder cannot clean up;
`cleanup` (and every new cluster) removes the namespaces of builders that
no longer run.

Requirements: root, iproute2 (`ip`, `tc`), `taskset`, and the right to add a
network namespace; `missing_requirements()` names whatever is missing.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "gnnc-c"
SUBNET = "10.213.0"  # host k: SUBNET.(k+1)/24, inside the cluster's namespaces only
RDZV_PORT = 29400  # free in a fresh namespace
MAX_HOSTS = 4
STOP_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """The cluster cannot be built or a command in it failed; the message says why."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP arrived: unwind like Ctrl-C so the cluster is torn down."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Within this block SIGTERM and SIGHUP raise `Stopped` (SIGINT raises KeyboardInterrupt already)."""
    def handler(signum: int, frame: object) -> None:
        for s in (signal.SIGTERM, signal.SIGHUP):  # a second signal must not interrupt the teardown
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def parse_rate(text: str) -> float:
    """A link rate as tc writes it ('1gbit', '10Gbit', '25gbit', '500mbit') in bits per second."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]?)bit\s*", text.lower())
    if not m:
        raise ClusterError(f"bandwidth {text!r}: expected a rate such as 1gbit, 10gbit or 500mbit")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if value <= 0:
        raise ClusterError(f"bandwidth {text!r} must be positive")
    return value


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"ip {' '.join(args)}: {r.stderr.strip() or f'exit status {r.returncode}'}")
    return r


def _in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} in {ns}: {r.stderr.strip() or f'exit status {r.returncode}'}")
    return r


def missing_requirements() -> list[str]:
    """What this machine lacks for an emulated cluster, in words; empty when it has everything."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, veth pairs and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("taskset", "util-linux")):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command (package {package})")
    if missing:
        return missing
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        missing.append(f"the right to add a network namespace (`ip netns add` said: {r.stderr.strip()})")
    else:
        _ip("netns", "del", probe, check=False)
    return missing


def _needs(missing: list[str]) -> str:
    return "an emulated cluster needs " + "; ".join(missing)


def refuse_without_requirements() -> bool:
    """Say on stderr what this machine lacks for an emulated cluster; True when it lacks anything (the
    command then exits 2)."""
    missing = missing_requirements()
    if missing:
        print(f"error: {_needs(missing)}", file=sys.stderr)
    return bool(missing)


def netem_available() -> bool:
    """Whether this kernel offers netem, the qdisc that adds latency (tried on a throwaway namespace)."""
    ns = f"{PREFIX}{os.getpid()}-netem"
    if _ip("netns", "add", ns, check=False).returncode != 0:
        return False
    try:
        _in_ns(ns, "ip", "link", "add", "t0", "type", "dummy", check=False)
        return _in_ns(ns, "tc", "qdisc", "add", "dev", "t0", "root", "netem", "delay", "1ms",
                      check=False).returncode == 0
    finally:
        _ip("netns", "del", ns, check=False)


def _namespaces() -> list[str]:
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _owner_alive(name: str) -> bool:
    m = re.match(rf"{re.escape(PREFIX)}(\d+)-", name)
    if not m:
        return True  # not ours to judge
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_processes(namespaces: Sequence[str]) -> None:
    """SIGTERM every process in these namespaces, SIGKILL what is left after STOP_TIMEOUT_S, and wait for them."""
    def pids() -> list[int]:
        out = []
        for ns in namespaces:
            r = _ip("netns", "pids", ns, check=False)
            out += [int(p) for p in r.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        return out

    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        live = pids()
        if not live:
            return
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        deadline = time.monotonic() + wait
        while pids() and time.monotonic() < deadline:
            time.sleep(0.05)


def _delete(namespaces: Sequence[str]) -> None:
    _stop_processes(namespaces)
    for ns in namespaces:  # hosts first: deleting a host deletes its veth pair, then the switch
        _ip("netns", "del", ns, check=False)


def cleanup_stale() -> list[str]:
    """Delete the namespaces (and stop the processes) of clusters whose builder no longer runs."""
    stale = sorted((ns for ns in _namespaces() if ns.startswith(PREFIX) and not _owner_alive(ns)),
                   key=lambda ns: ns.endswith("-sw"))
    _delete(stale)
    return stale


@dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, its address on the cluster network, the cores it runs on."""

    index: int
    namespace: str
    address: str
    cpus: tuple[int, ...]
    port: str  # its veth end in the switch namespace


def core_shares(hosts: int, cpus: Sequence[int]) -> list[tuple[int, ...]]:
    """Each host's cores: an equal contiguous share, or one core each (shared) when hosts outnumber cores."""
    cpus = sorted(cpus)
    if hosts <= len(cpus):
        per = len(cpus) // hosts
        return [tuple(cpus[k * per:(k + 1) * per]) for k in range(hosts)]
    return [(cpus[k % len(cpus)],) for k in range(hosts)]


def _die_with_parent() -> None:
    """Run in the child before exec: Linux SIGKILLs it when this builder dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


class EmulatedCluster:
    """`hosts` namespaces behind one bridge, each link shaped to `bandwidth` (a tc rate such as '10gbit').

    Use it as a context manager: the cluster exists inside the `with` block and
    is torn down when the block ends, however it ends.
    """

    def __init__(self, hosts: int, bandwidth: str, delay_ms: float = 0.0, cpus: Sequence[int] | None = None):
        if not 2 <= hosts <= MAX_HOSTS:
            raise ClusterError(f"an emulated cluster has 2 to {MAX_HOSTS} hosts, not {hosts}")
        self.rate_bps = parse_rate(bandwidth)
        self.bandwidth = bandwidth
        if delay_ms < 0:
            raise ClusterError(f"delay must not be negative, not {delay_ms}")
        self.delay_ms = delay_ms
        self.tag = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"  # several clusters per process: a random part
        self.switch = f"{self.tag}-sw"
        shares = core_shares(hosts, cpus if cpus is not None else os.sched_getaffinity(0))
        self.hosts = [Host(k, f"{self.tag}-h{k}", f"{SUBNET}.{k + 1}", shares[k], f"h{k}") for k in range(hosts)]
        self._created: list[str] = []

    # --- building and tearing down ---------------------------------------------------------------

    def __enter__(self) -> "EmulatedCluster":
        try:
            self.create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def create(self) -> None:
        missing = missing_requirements()
        if missing:
            raise ClusterError(_needs(missing))
        if self.delay_ms and not netem_available():
            raise ClusterError(f"--delay {self.delay_ms} ms needs the netem qdisc, which this kernel "
                               f"({os.uname().release}) does not offer; run without a delay")
        cleanup_stale()
        self._add_namespace(self.switch)
        _in_ns(self.switch, "ip", "link", "set", "lo", "up")
        _in_ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        _in_ns(self.switch, "ip", "link", "set", "br0", "up")
        for host in self.hosts:
            self._add_namespace(host.namespace)
            # both ends are created inside their namespaces: nothing appears in the machine's own
            _ip("link", "add", host.port, "netns", self.switch, "type", "veth",
                "peer", "name", "eth0", "netns", host.namespace)
            _in_ns(self.switch, "ip", "link", "set", host.port, "master", "br0")
            _in_ns(self.switch, "ip", "link", "set", host.port, "up")
            _in_ns(host.namespace, "ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
            _in_ns(host.namespace, "ip", "link", "set", "eth0", "up")
            _in_ns(host.namespace, "ip", "link", "set", "lo", "up")
            self._shape(host.namespace, "eth0", "add")  # what the host sends
            self._shape(self.switch, host.port, "add")  # what it receives

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def _shape(self, ns: str, dev: str, verb: str) -> None:
        """A token bucket at the link rate; its bucket holds 1 ms of traffic (at least 64 KiB, so a
        whole GSO segment fits), its queue 50 ms."""
        rate = f"{int(self.rate_bps)}bit"
        burst = str(max(64 * 1024, int(self.rate_bps / 8 / 1000)))
        tbf = ["tbf", "rate", rate, "burst", burst, "latency", "50ms"]
        if self.delay_ms:
            _in_ns(ns, "tc", "qdisc", verb, "dev", dev, "root", "handle", "1:", "netem", "delay",
                   f"{self.delay_ms}ms")
            _in_ns(ns, "tc", "qdisc", verb, "dev", dev, "parent", "1:1", "handle", "10:", *tbf)
        else:
            _in_ns(ns, "tc", "qdisc", verb, "dev", dev, "root", *tbf)

    def set_bandwidth(self, bandwidth: str) -> None:
        """Reshape every link to `bandwidth` (the namespaces and the processes in them stay)."""
        self.rate_bps = parse_rate(bandwidth)
        self.bandwidth = bandwidth
        for host in self.hosts:
            for ns, dev in ((host.namespace, "eth0"), (self.switch, host.port)):
                _in_ns(ns, "tc", "qdisc", "del", "dev", dev, "root")
                self._shape(ns, dev, "add")

    def set_link(self, host: int, up: bool) -> None:
        """Plug or pull host `host`'s cable: its veth end on the switch goes up or down."""
        _in_ns(self.switch, "ip", "link", "set", self.hosts[host].port, "up" if up else "down")

    def teardown(self) -> None:
        """Stop every process in the cluster's namespaces, then delete them (hosts first)."""
        names = sorted(self._created, key=lambda ns: ns == self.switch)
        self._created = []
        _delete(names)

    @property
    def namespaces(self) -> list[str]:
        return [h.namespace for h in self.hosts] + [self.switch]

    # --- running commands ------------------------------------------------------------------------

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """`argv` as run on host `host`: in its namespace, on its cores."""
        h = self.hosts[host]
        return ["ip", "netns", "exec", h.namespace, "taskset", "-c", ",".join(map(str, h.cpus)), *argv]

    def popen(self, host: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **kwargs: object) -> subprocess.Popen:
        """Start `argv` on host `host`; it dies with this process (and teardown stops it in any case)."""
        return subprocess.Popen(self.command(host, argv), env=env, preexec_fn=_die_with_parent, **kwargs)

    def torchrun_command(self, host: int, nproc_per_host: int, args: Sequence[str], run_id: str = "gnnc",
                         python: str = sys.executable) -> list[str]:
        """torchrun's agent for host `host`: c10d rendezvous on host 0, this host's address as its own.

        `--local-addr` makes the agents announce their namespace addresses (the hostname
        they would announce otherwise resolves to loopback here), and host 0 is told it
        hosts the rendezvous store (torchrun cannot tell from an address alone).
        """
        return [python, "-m", "torch.distributed.run", "--nnodes", str(len(self.hosts)),
                "--nproc-per-node", str(nproc_per_host), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{self.hosts[0].address}:{RDZV_PORT}", "--rdzv-id", run_id,
                "--rdzv-conf", f"is_host={1 if host == 0 else 0}", "--local-addr", self.hosts[host].address,
                "--max-restarts", "0", *args]

    def host_env(self, host: int, nproc_per_host: int, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of a host's processes: its cores shared by its ranks' threads."""
        threads = max(1, len(self.hosts[host].cpus) // nproc_per_host)
        return {**(os.environ if base is None else base), "OMP_NUM_THREADS": str(threads)}

    def start_torchrun(self, args: Sequence[str], nproc_per_host: int = 1, run_id: str = "gnnc",
                       env: dict[str, str] | None = None, **kwargs: object) -> list[subprocess.Popen]:
        """One torchrun agent per host running `args` (e.g. ['-m', 'gnnc', 'run', PLAN])."""
        return [self.popen(k, self.torchrun_command(k, nproc_per_host, args, run_id),
                           env=self.host_env(k, nproc_per_host, env), **kwargs) for k in range(len(self.hosts))]

    def run_torchrun(self, args: Sequence[str], nproc_per_host: int = 1, timeout_s: float = 600.0,
                     run_id: str = "gnnc", env: dict[str, str] | None = None) -> list[tuple[int, str, str]]:
        """Run `args` under torchrun on every host and wait: (exit status, stdout, stderr) per host.

        An agent still running after `timeout_s` is stopped with everything in its host
        (its status then reads as the signal, negative).
        """
        procs = self.start_torchrun(args, nproc_per_host, run_id, env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + timeout_s
        out = []
        for k, p in enumerate(procs):
            try:
                stdout, stderr = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop_processes([self.hosts[k].namespace])
                stdout, stderr = p.communicate()
            out.append((p.returncode, stdout, stderr))
        return out


# --- the command line ----------------------------------------------------------------------------


def _cluster_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hosts", type=int, default=2, help=f"hosts (namespaces), 2 to {MAX_HOSTS}")
    ap.add_argument("--bandwidth", default="10gbit", help="each host's link rate, a tc rate: 1gbit, 10gbit, 25gbit")
    ap.add_argument("--delay", type=float, default=0.0, metavar="MS",
                    help="one-way latency added to each link (needs the kernel's netem qdisc)")
    ap.add_argument("--nproc-per-host", type=int, default=1, help="ranks torchrun starts on each host")


def _describe(cluster: EmulatedCluster) -> str:
    lines = [f"emulated cluster {cluster.tag}: {len(cluster.hosts)} hosts, links {cluster.bandwidth} each way"
             + (f", {cluster.delay_ms} ms delay" if cluster.delay_ms else ", no added latency")]
    for h in cluster.hosts:
        lines.append(f"  host {h.index}: namespace {h.namespace}, {h.address}, cores {','.join(map(str, h.cpus))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the cluster and hold it until Ctrl-C, SIGTERM or SIGHUP")
    _cluster_args(up)
    tr = sub.add_parser("torchrun", help="run torchrun on every host: emulated.py torchrun [options] -- ARGS")
    _cluster_args(tr)
    tr.add_argument("--timeout", type=float, default=3600.0, help="seconds before the job is stopped")
    tr.add_argument("args", nargs=argparse.REMAINDER)
    pr = sub.add_parser("probe", help="measure the cluster's links with `gnnc probe --network` into a profile")
    _cluster_args(pr)
    pr.add_argument("-o", "--output", required=True, help="the profile to write (a --cluster FILE)")
    pr.add_argument("--base", help="keep the machine figures of this profile (else host 0 measures its own)")
    pr.add_argument("--timeout", type=float, default=1800.0)
    sub.add_parser("cleanup", help="remove what clusters whose builder was SIGKILLed left behind")
    sub.add_parser("check", help="say whether this machine can build a cluster, and whether netem exists")
    args = ap.parse_args(argv)

    if args.command == "cleanup":
        for ns in cleanup_stale():
            print(f"removed {ns}")
        return 0
    if args.command == "check":
        missing = missing_requirements()
        print("ok" if not missing else "missing: " + "; ".join(missing))
        if not missing:
            print(f"netem (added latency): {'available' if netem_available() else 'not available on this kernel'}")
        return 0 if not missing else 2
    if refuse_without_requirements():
        return 2
    try:
        with stop_on_signals(), EmulatedCluster(args.hosts, args.bandwidth, args.delay) as cluster:
            print(_describe(cluster), flush=True)
            if args.command == "up":
                print("holding; Ctrl-C (or SIGTERM) tears it down", flush=True)
                while True:
                    time.sleep(3600)
            if args.command == "torchrun":
                rest = args.args[1:] if args.args[:1] == ["--"] else args.args
                if not rest:
                    print("error: nothing to run: emulated.py torchrun [options] -- ARGS", file=sys.stderr)
                    return 2
                procs = cluster.start_torchrun(rest, args.nproc_per_host)
                return _wait_all(procs, args.timeout)
            # probe
            base = ["--base", args.base] if args.base else []
            procs = cluster.start_torchrun(["-m", "gnnc", "probe", "--network", "-o", args.output, *base],
                                           args.nproc_per_host)
            return _wait_all(procs, args.timeout)
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the cluster is torn down", file=sys.stderr)
        return 130
    except Stopped as stop:
        print(f"{stop}; the cluster is torn down", file=sys.stderr)
        return 128 + stop.signum


def _wait_all(procs: list[subprocess.Popen], timeout_s: float) -> int:
    """Wait for every host's agent (up to `timeout_s`); the worst exit status, 124 on a timeout."""
    deadline = time.monotonic() + timeout_s
    worst = 0
    for p in procs:
        try:
            code = p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"error: the job ran past {timeout_s:.0f} s; stopping it", file=sys.stderr)
            return 124
        worst = worst or code
    return worst


if __name__ == "__main__":
    sys.exit(main())
