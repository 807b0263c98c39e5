"""An epoch on a machine other processes want too: gnnc and PyG, quiet and beside competitors (issue 42).

Each case (the README's demo, Cora GCN; a GCN and a GAT on an R-MAT graph of 200K vertices, features and hidden
128, GAT 8 heads x 16) is timed, epoch = training step + evaluation forward, median after warm-up:

* quiet: nothing else started by this script (on a shared machine, whatever else runs: see the load);
* busy: beside a plain CPU-bound loop per core (a Python `while True: pass` each);
* torch: beside another torch process multiplying 512x512 matrices in a loop with as many threads as cores,
  under OpenMP's defaults (its threads spin at every barrier): the case that hurts most;

for gnnc under its default settings and each alternative (`--settings`: threads=N, OMP_WAIT_POLICY=passive or
active, GOMP_SPINCOUNT=N; `spin=300000` is OpenMP's own default, gnnc's before issue 42), and PyG's epoch under
torch's defaults in the same conditions. Every measurement is a fresh process (OpenMP reads its settings once,
when torch loads it), started with this environment less any OpenMP wait setting, so "default" is gnnc's own,
and with torch's huge-page advice on, as `gnnc run` and benchmarks/vs_pyg.py allocate (gnnc.host).
Printed and written (benchmarks/RESULTS-contention.md): each epoch in ms, its ratio to the same setting's quiet
epoch, the epochs warmed up and timed, and the load average (/proc/loadavg) before and after each figure; and a
second table of counters per timed epoch (`Counters`), which other load does not change much: the process's CPU
time (user + system, all threads), its system time, minor page faults, sleeps and preemptions, and the time the
hypervisor ran something else on this machine's CPUs (steal). CPU time over the epoch's time is the cores the epoch
got: the 200K GCN's quiet epoch came out bimodal (738-1658 ms, RESULTS-contention.md) while its CPU time, faults
and sleeps per epoch were the same in every process measured, so a slow quiet figure with the CPU time of a fast one
is time the epoch waited for a core, not work it did.

Warm-up and budget (`Timing`): a case warms up for at least --warmup epochs and --warmup-s seconds and then until
an epoch takes within 15% of the one before it (after 2 warm-up epochs a 200K-vertex graph's quiet epoch was
measured slower than its loaded one: RESULTS-contention.md), then --epochs epochs are timed; a case
stops at --budget-s seconds of epochs (warm-up at most a third of it) once it has 3 timed epochs. So a run takes
at most about children x (start-up + cases x budget), children = competitors x (settings + PyG).

PyG's peer is what PyG's own example (examples/gcn.py) writes: GCNConv with cached=True (normalisation and
self-loops computed once), dropout on the dense input features, Adam. On Cora most of its epoch is that dropout:
torch's CPU `bernoulli_` draws a 2708 x 1433 mask (measured with torch 2.13 on one thread, loaded machine: the
dropout 116 ms of a 132 ms epoch's CPU time, bernoulli_ 92 of them), where gnnc draws only the features' nonzeros
(the same distribution). So the PyG rows come twice: the epoch, and the epoch less its input dropout (timed alone
in the same process and conditions).

    python benchmarks/contention.py                 # 200K vertices, 20 timed epochs (Cora 100) after >= 4 (Cora 20)
    python benchmarks/contention.py --quick         # 50K vertices, 6 timed epochs (Cora 30) after >= 2 (Cora 10)
    python benchmarks/contention.py --cases cora-gcn --settings default,threads=1,passive --competitors quiet,torch
    python benchmarks/contention.py --cases rmat-gcn,rmat-gat --settings default --budget-s 60
    python benchmarks/contention.py --cases rmat-gcn --settings '' --competitors quiet,torch   # PyG alone
    python benchmarks/contention.py --quick --realtime   # a shared machine: quiet epochs at real-time priority

The full run needs the machine to itself (the competitors are the only other load it should see). On a shared
one, --realtime times the quiet epochs (only those, for the seconds they take) ahead of the other processes.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "RESULTS-contention.md"
# what gnnc or a user may set for OpenMP's waiting (gnnc.host): taken out of every measurement's environment
WAIT_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS")
COMPETITORS = ("quiet", "busy", "torch")
MATMUL = 512  # the competitor's matrices: small enough that its threads meet at a barrier every few ms
STEADY = 0.15  # warmed up: an epoch within this fraction of the one before it
MIN_TIMED = 3  # timed epochs a case gets even past its budget: a median needs some
CHILD_START_S = 180  # a child's own start, graph and compile per case, beyond its budget, before it is given up


def _cases(n: int) -> dict[str, tuple[str, str, int | None]]:
    """case -> (model, graph spec, hidden width or None for the example's own sizes)."""
    rmat = f"rmat:n={n},deg=10,features=128,classes=16,seed=0"
    return {"cora-gcn": ("gcn", "planetoid:cora", None), "rmat-gcn": ("gcn", rmat, 128),
            "rmat-gat": ("gat", rmat, 128)}


def _setting(name: str) -> tuple[int | None, dict[str, str]]:
    """A --settings entry as (threads or None for gnnc's choice, the environment it adds)."""
    if name == "default":
        return None, {}
    key, _, value = name.partition("=")
    if key == "threads" and value.isdigit():
        return int(value), {}
    if key == "spin" and value.isdigit():
        return None, {"GOMP_SPINCOUNT": value}
    if name in ("passive", "active"):
        return None, {"OMP_WAIT_POLICY": name}
    raise SystemExit(f"contention.py: unknown setting {name!r} (default, threads=N, spin=N, passive, active)")


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ----- one measurement, in its own process

COUNTERS = ("cpu_ms", "sys_ms", "minflt", "sleeps", "preempted", "others_ms", "steal_ms")  # per epoch, `Counters`
_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


class Counters:
    """What an epoch cost this process besides its time: CPU ms (user + system, every thread) and system ms, minor
    page faults, voluntary context switches (a thread went to sleep: an OpenMP thread waiting for work past its spin)
    and involuntary ones (preempted), from getrusage; and from /proc/stat, over every CPU of the machine: the CPU
    time everything else on it took (its busy time less this process's: a "quiet" machine's other load, kernel
    threads included) and the time the hypervisor gave its CPUs to someone else (steal: a virtual machine's quiet
    is not its host's). `take()` returns them since the previous call."""

    def __init__(self) -> None:
        self.last = self._now()

    @staticmethod
    def _now() -> tuple[float, ...]:
        r = resource.getrusage(resource.RUSAGE_SELF)
        cpu_ms = (r.ru_utime + r.ru_stime) * 1000
        busy_ms, steal_ms = _machine_ms()
        return cpu_ms, r.ru_stime * 1000, r.ru_minflt, r.ru_nvcsw, r.ru_nivcsw, busy_ms - cpu_ms, steal_ms

    def take(self) -> dict[str, float]:
        now = self._now()
        delta = {k: b - a for k, a, b in zip(COUNTERS, self.last, now)}
        self.last = now
        return delta


def _machine_ms() -> tuple[float, float]:
    """The machine's busy time (user, nice, system, irq, softirq) and steal time so far, ms over all CPUs; zeros
    where /proc/stat does not say."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    except (OSError, ValueError):
        return 0.0, 0.0
    return (user + nice + system + irq + softirq) * _TICK_MS, steal * _TICK_MS


@dataclass
class Timing:
    """One case's epochs (module docstring): warm-up until the epoch time is steady, then timed epochs, within a
    budget of `budget_s` seconds of epochs."""

    warmup: int  # epochs warmed up at least
    warmup_s: float  # seconds warmed up at least
    epochs: int  # epochs timed at most
    budget_s: float
    times: list[float] = field(default_factory=list)
    counted: list[dict[str, float]] = field(default_factory=list)  # `Counters` per epoch, where taken
    warm_at: int | None = None  # the first timed epoch, once warmed up

    def add(self, seconds: float, counters: dict[str, float] | None = None) -> bool:
        """Record an epoch of `seconds` (and its `Counters`); True when the case has been timed enough."""
        self.times.append(seconds)
        if counters is not None:
            self.counted.append(counters)
        spent = sum(self.times)
        if self.warm_at is None:
            steady = len(self.times) >= 2 and abs(seconds - self.times[-2]) <= STEADY * self.times[-2]
            if (len(self.times) >= self.warmup and spent >= self.warmup_s and steady) or spent >= self.budget_s / 3:
                self.warm_at = len(self.times)
            return False
        timed = len(self.times) - self.warm_at
        return timed >= self.epochs or (timed >= MIN_TIMED and spent >= self.budget_s)

    def row(self) -> dict:
        timed = self.times[self.warm_at:] if self.warm_at is not None else []
        counted = self.counted[self.warm_at:] if self.warm_at is not None else []
        # each counter's median over the timed epochs (so CPU / epoch is a ratio of medians, near the typical epoch's)
        return {"epoch_s": statistics.median(timed), "warmup": self.warm_at, "epochs": len(timed),
                "warmup_s": sum(self.times[:self.warm_at]), "first_s": self.times[0],
                **({"counters": {k: statistics.median(c[k] for c in counted) for k in COUNTERS}} if counted else {})}


class _Enough(Exception):
    """Raised from gnnc.run's epoch callback once the case is timed: the run stops there."""


def measure(system: str, setting: str, cases: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Time each case in this process: {case: {"epoch_s", "load_before", "load_after", ...}}."""
    threads, _ = _setting(setting) if system == "gnnc" else (None, {})
    if system == "gnnc":
        import gnnc  # first: gnnc's start-up sets the wait policy before torch loads OpenMP (gnnc.host)
    import floor  # benchmarks/floor.py (imports torch)
    import torch
    import vs_pyg

    out = {}
    for case in cases:
        model, spec, hidden = _cases(args.n)[case]
        small = spec.startswith("planetoid")
        timing = Timing(*((args.warmup * 5, args.warmup_s, args.epochs * 5) if small else
                          (args.warmup, args.warmup_s, args.epochs)), args.budget_s)
        load_before = loadavg()
        torch.manual_seed(0)
        graph = floor.bench_graph(spec, 0, 0, 0, 0)  # a gnnc graph spec
        if system == "pyg":
            torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
            step = vs_pyg.pyg_epoch(model, graph, argparse.Namespace(device="cpu", hidden=hidden, heads=8))
            counters = Counters()
            while True:
                t0 = time.perf_counter()
                counters.take()
                step()
                done = timing.add(time.perf_counter() - t0, counters.take())
                if timing.warm_at == len(timing.times):
                    _timed_part(args.realtime)
                if done:
                    break
            row = {**timing.row(), "input_dropout_s": _input_dropout(model, graph, timing.row()["epochs"]),
                   "threads": torch.get_num_threads(), "wait_policy": "OpenMP's default"}
            _timed_part(False)
        else:
            from gnnc.host import wait_policy

            plan = floor.compile_model(model, graph, hidden, 8)
            seen: dict[str, int] = {}
            counters = Counters()  # from one epoch's end to the next: its step, its evaluation, what runs between

            def after(rec: dict) -> None:
                seen["threads"] = torch.get_num_threads()  # what the run trains with (gnnc.run sets it)
                done = timing.add(rec["time_s"] + rec["eval_time_s"], counters.take())
                if timing.warm_at == len(timing.times):
                    _timed_part(args.realtime)
                if done:
                    raise _Enough

            try:
                gnnc.run(plan, graph, epochs=1_000_000, threads=threads or "auto", on_epoch=after)
            except _Enough:
                pass
            _timed_part(False)
            row = {**timing.row(), "threads": seen["threads"], "wait_policy": wait_policy()}
        out[case] = {**row, "load_before": load_before, "load_after": loadavg()}
        del graph
    return out


def _input_dropout(model: str, graph, times: int) -> float:
    """The median time of PyG's first dropout alone (on the dense input features, as vs_pyg.pyg_two_layer has it)."""
    import torch.nn.functional as F

    x = graph.x.to_dense() if graph.x.is_sparse else graph.x
    spent = []
    for _ in range(min(max(times, 1), 5)):  # 5 at most: at 200K vertices each draws 25.6M
        t0 = time.perf_counter()
        F.dropout(x, 0.6 if model == "gat" else 0.5, training=True)
        spent.append(time.perf_counter() - t0)
    return statistics.median(spent)


def _timed_part(realtime: bool) -> None:
    """--realtime: every thread of this process (torch's OpenMP pool among them) round-robin real-time while the
    epochs are timed, ahead of every ordinary process: on a shared machine, the nearest to a quiet one, for the
    seconds the timed epochs take (the kernel still leaves the others 5% of each second). False: back to normal."""
    if not realtime and os.sched_getscheduler(0) == os.SCHED_OTHER:
        return
    policy, param = (os.SCHED_RR, os.sched_param(1)) if realtime else (os.SCHED_OTHER, os.sched_param(0))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, param)
        except ProcessLookupError:
            pass


# ----- the competitors


def start_competitor(kind: str, cores: int) -> subprocess.Popen | None:
    """A competitor in its own process group (stopped with it), under torch's and OpenMP's defaults."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    if kind == "quiet":
        return None
    if kind == "busy":
        code = (f"import multiprocessing as mp\n"
                f"def spin():\n    while True: pass\n"
                f"if __name__ == '__main__':\n"
                f"    ps = [mp.Process(target=spin, daemon=True) for _ in range({cores})]\n"
                f"    [p.start() for p in ps]; [p.join() for p in ps]\n")
    else:
        code = (f"import torch\ntorch.set_num_threads({cores})\na = torch.randn({MATMUL}, {MATMUL})\n"
                f"while True:\n    b = a @ a\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    time.sleep(2.0)  # its threads running before the measurement starts
    return proc


def stop_competitor(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_child(system: str, setting: str, comp: str, cases: list[str], args: argparse.Namespace) -> dict[str, dict]:
    _, extra = _setting(setting) if system == "gnnc" else (None, {})
    env = {**{k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}, **extra}
    command = [sys.executable, str(Path(__file__)), "--one", f"{system}:{setting}", "--cases", ",".join(cases),
               "--n", str(args.n), "--epochs", str(args.epochs), "--warmup", str(args.warmup),
               "--warmup-s", str(args.warmup_s), "--budget-s", str(args.budget_s)]
    if args.realtime and comp == "quiet":
        command.append("--realtime")
    try:
        r = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT,
                           timeout=args.child_timeout or len(cases) * (2 * args.budget_s + CHILD_START_S))
    except subprocess.TimeoutExpired as e:
        return {case: {"error": f"timed out after {e.timeout:.0f} s"} for case in cases}
    if r.returncode != 0:
        error = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        return {case: {"error": error} for case in cases}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ----- the table

def table(rows: dict[tuple[str, str, str], dict], cases: list[str], settings: list[str],
          competitors: list[str]) -> list[str]:
    """Markdown rows: per case and setting, each competitor's epoch in ms, its ratio to the quiet one, loads."""
    head = "| case | setting | threads | " + " | ".join(
        f"{c} ms{'' if c == 'quiet' else ' (x quiet)'} | load" for c in competitors) + " |"
    lines = [head, "|" + "---|" * (3 + 2 * len(competitors))]
    for case in cases:
        pyg = [("pyg", "torch's defaults", "PyG"), ("pyg", "torch's defaults", "PyG less its input dropout")]
        for system, setting, name in [("gnnc", s, s) for s in settings] + (pyg if any(k[0] == "pyg" for k in rows)
                                                                           else []):
            def epoch(r: dict) -> float | None:
                if "epoch_s" not in r:
                    return None
                return r["epoch_s"] - r["input_dropout_s"] if name.startswith("PyG less") else r["epoch_s"]

            quiet = epoch(rows.get((system, setting, "quiet"), {}).get(case, {}))
            cells, threads = [], "-"
            for comp in competitors:
                r = rows.get((system, setting, comp), {}).get(case, {})
                seconds = epoch(r)
                if seconds is None:
                    cells += [r.get("error", "-"), "-"]
                    continue
                threads = str(r["threads"])
                ms = f"{seconds * 1000:.1f}"
                if comp != "quiet" and quiet:
                    ms += f" ({seconds / quiet:.2f}x)"
                cells += [ms + f" [{r['epochs']} after {r['warmup']}]", f"{r['load_before']} / {r['load_after']}"]
            lines.append(f"| {case} | {name} | {threads} | " + " | ".join(cells) + " |")
    return lines


def counter_table(rows: dict[tuple[str, str, str], dict], cases: list[str], settings: list[str],
                  competitors: list[str]) -> list[str]:
    """Markdown rows: each measurement's `Counters`, medians per timed epoch, and its CPU time over its epoch time
    (the cores the epoch kept busy: a quiet 2-thread epoch that got both cores is near 2)."""
    lines = ["| case | setting | beside | epoch ms | CPU ms (cores) | sys ms | minor faults | sleeps | preempted | "
             "others' CPU ms | steal ms |", "|" + "---|" * 11]
    for case in cases:
        for system, setting, name in [("gnnc", s, s) for s in settings] + [("pyg", "torch's defaults", "PyG")]:
            for comp in competitors:
                r = rows.get((system, setting, comp), {}).get(case, {})
                if "counters" not in r:
                    continue
                c, ms = r["counters"], r["epoch_s"] * 1000
                lines.append(f"| {case} | {name} | {comp} | {ms:.1f} | {c['cpu_ms']:.0f} ({c['cpu_ms'] / ms:.2f}) | "
                             f"{c['sys_ms']:.0f} | {c['minflt']:.0f} | {c['sleeps']:.0f} | {c['preempted']:.0f} | "
                             f"{c['others_ms']:.0f} | {c['steal_ms']:.0f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50K vertices, fewer epochs (a shared machine)")
    ap.add_argument("--cases", default="cora-gcn,rmat-gcn,rmat-gat")
    ap.add_argument("--settings", default="default,threads=1,passive,active,spin=300000,spin=10000",
                    help="gnnc's settings measured ('' for none: PyG alone)")
    ap.add_argument("--competitors", default=",".join(COMPETITORS))
    ap.add_argument("--no-pyg", action="store_true", help="gnnc only")
    ap.add_argument("--n", type=int, help="vertices of the R-MAT graph (default 200000; --quick 50000)")
    ap.add_argument("--epochs", type=int, help="timed epochs at most (default 20, --quick 6; Cora 5x as many)")
    ap.add_argument("--warmup", type=int,
                    help="epochs before timing at least (default 4, --quick 2; Cora 5x as many), then until steady")
    ap.add_argument("--warmup-s", type=float, default=5.0, help="seconds of epochs before timing at least")
    ap.add_argument("--budget-s", type=float, default=90.0,
                    help="seconds of epochs per case and measurement (warm-up at most a third), past which it stops "
                         f"once it has {MIN_TIMED} timed epochs")
    ap.add_argument("--realtime", action="store_true",
                    help="time the quiet epochs at real-time priority (needs CAP_SYS_NICE): on a shared machine the "
                         "nearest to a quiet one; the competitors' epochs stay among the machine's other load")
    ap.add_argument("--output", type=Path, default=RESULTS, help="the Markdown file written")
    ap.add_argument("--child-timeout", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: system:setting measured in this process
    args = ap.parse_args()
    args.n = args.n or (50_000 if args.quick else 200_000)
    args.epochs = args.epochs or (6 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 4)
    cases = args.cases.split(",")
    if args.one:
        sys.path.insert(0, str(HERE))
        system, setting = args.one.split(":", 1)
        print(json.dumps(measure(system, setting, cases, args)))
        return
    from gnnc.host import use_huge_pages  # here: the measuring child imports gnnc (or not, for PyG) itself
    # --settings '' measures PyG alone (a second run on the same table's conditions)
    settings, competitors = [s for s in args.settings.split(",") if s], args.competitors.split(",")
    for s in settings:
        _setting(s)
    cores = len(os.sched_getaffinity(0))
    use_huge_pages()  # every measurement's process inherits it: allocated as `gnnc run` allocates (gnnc.host)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout's SIGTERM still stops the competitor
    started, load_start = time.perf_counter(), loadavg()
    rows: dict[tuple[str, str, str], dict] = {}
    for comp in competitors:
        proc = start_competitor(comp, cores)
        try:
            pyg = [] if args.no_pyg else [("pyg", "torch's defaults")]
            for system, setting in [("gnnc", s) for s in settings] + pyg:
                rows[(system, setting, comp)] = run_child(system, setting, comp, cases, args)
                print(f"{comp:6s} {system:4s} {setting:18s} " + "  ".join(
                    f"{c} {r['epoch_s'] * 1000:.1f} ms (CPU {r.get('counters', {}).get('cpu_ms', 0):.0f} ms, steal "
                    f"{r.get('counters', {}).get('steal_ms', 0):.0f} ms; load {r['load_before']} / {r['load_after']})"
                    if "epoch_s" in r
                    else f"{c} {r.get('error')}" for c, r in rows[(system, setting, comp)].items()), flush=True)
        finally:
            stop_competitor(proc)
    first = next((r for v in rows.values() for r in v.values() if "epochs" in r), {})
    lines = [f"# An epoch beside other processes (benchmarks/contention.py{' --quick' if args.quick else ''})", "",
             f"{cores} cores; R-MAT graph of {args.n} vertices (deg 10, features and hidden 128, GAT 8 heads x 16); "
             f"Cora at the example's sizes. Epoch = training step + evaluation forward, the median of at most "
             f"{args.epochs} timed epochs (Cora {5 * args.epochs}) after at least {args.warmup} "
             f"(Cora {5 * args.warmup}) and {args.warmup_s:g} s of warm-up, then until an epoch is within {STEADY:.0%} "
             f"of the one before, within {args.budget_s:g} s of epochs per case ([timed after warm-up] beside each). "
             f"busy: a CPU-bound "
             f"loop per core; torch: a {MATMUL}x{MATMUL} matmul loop on {cores} threads under OpenMP's defaults. "
             f"{'Quiet epochs timed at real-time priority (--realtime). ' if args.realtime else ''}"
             f"Load average (1, 5, 15 min) before / after each figure. {time.perf_counter() - started:.0f} s in all; "
             f"load {load_start} at the start, {loadavg()} at the end.", "", *table(rows, cases, settings, competitors),
             "", "Per timed epoch (medians; contention.Counters): the process's CPU time (user + system, all threads) "
             "and in brackets over the epoch's time, the cores it kept busy; system time; minor page faults; sleeps "
             "(voluntary context switches) and preemptions; others' CPU, what everything else on this machine took "
             "(all CPUs, kernel threads and the competitors included, /proc/stat's busy time less this process's); "
             "steal, the ms this virtual machine's CPUs were held by its host for something else.", "",
             *counter_table(rows, cases, settings, competitors)]
    if not first:
        lines.append("\n(no figure: every measurement failed)")
    print("\n".join(lines))
    args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
