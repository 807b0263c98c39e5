"""The emulated cluster (benchmarks/cluster): hosts as network namespaces, shaped links, torchrun across them.

Checks that need namespaces skip with the reason when this machine cannot add
one (not root, no iproute2, or no right to `ip netns add`, as in some CI
containers). Everything a test builds is torn down by the test, and the
teardown itself is tested: a builder stopped mid-run (SIGTERM) leaves no
namespace, interface or process, and what a SIGKILLed one leaves is reaped.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, gnnc_in_process, process_alive
from gnnc.errors import GnncError
from gnnc.runtime.launch import DistConfig
from gnnc.runtime.netif import interface_toward
from gnnc.runtime import peers

sys.path.insert(0, str(ROOT / "benchmarks" / "cluster"))
import emulated  # noqa: E402  (benchmarks are scripts, not a package)
from emulated import EmulatedCluster, cleanup_stale, core_shares, missing_requirements, parse_rate  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "cluster" / "emulated.py"


def need_cluster() -> None:
    missing = missing_requirements()
    if missing:
        pytest.skip("the emulated cluster needs " + "; ".join(missing))


def _namespaces(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def _ns_pids(namespaces: list[str]) -> list[int]:
    pids = []
    for ns in namespaces:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    return pids


# --- without namespaces --------------------------------------------------------------------------


def test_rates_and_core_shares() -> None:
    assert parse_rate("1gbit") == 1e9 and parse_rate("25Gbit") == 25e9 and parse_rate("500mbit") == 5e8
    with pytest.raises(emulated.ClusterError, match="expected a rate"):
        parse_rate("fast")
    assert core_shares(2, [0, 1]) == [(0,), (1,)]
    assert core_shares(2, [0, 1, 2, 3]) == [(0, 1), (2, 3)]
    assert core_shares(4, [0, 1]) == [(0,), (1,), (0,), (1,)]  # more hosts than cores: they share
    with pytest.raises(emulated.ClusterError, match="2 to 4 hosts"):
        EmulatedCluster(5, "1gbit")


def test_missing_requirements_are_named(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(emulated.shutil, "which", lambda tool: None if tool == "tc" else f"/usr/bin/{tool}")
    missing = missing_requirements()
    assert any(m.startswith("root") for m in missing)
    assert any("`tc`" in m and "iproute2" in m for m in missing)
    r = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True)
    assert r.returncode in (0, 2) and (r.stdout.startswith("ok") or r.stdout.startswith("missing: "))


def test_a_joined_rank_pins_gloo_to_the_interface_that_reaches_the_rendezvous_host() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert DistConfig.from_env(env).gloo_ifname == interface_toward("127.0.0.1") == "lo"
    assert DistConfig.from_env({**env, "GLOO_SOCKET_IFNAME": "eth7"}).gloo_ifname == "eth7"  # the user's word
    assert interface_toward("no-such-host.invalid") is None


def test_a_peer_that_answers_is_reachable_and_a_silent_one_is_named(monkeypatch) -> None:
    with socket.socket() as listener:  # refused or accepted: either way the host is there
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert peers.probe("127.0.0.1", listener.getsockname()[1]) is None
        closed = listener.getsockname()[1]
    assert peers.probe("127.0.0.1", closed) is None
    table = peers.PeerTable(("10.0.0.1", "10.0.0.2", "10.0.0.2", "10.0.0.3"), 29500)
    monkeypatch.setattr(peers, "probe", lambda address, port, timeout_s: "no answer within 2 s"
                        if address == "10.0.0.2" else None)
    assert peers.diagnose(table, 0) == ("cannot reach rank 1 at 10.0.0.2 (no answer within 2 s), rank 2 at "
                                        "10.0.0.2 (no answer within 2 s)")
    monkeypatch.setattr(peers, "probe", lambda address, port, timeout_s: "Network is unreachable")
    assert "this rank's own link (at 10.0.0.2) is probably down" in peers.diagnose(table, 1)
    monkeypatch.setattr(peers, "probe", lambda address, port, timeout_s: None)
    assert peers.diagnose(table, 3).startswith("every peer still answers")


def test_network_measurements_become_profile_fields() -> None:
    from gnnc.cluster import ClusterProfile, preset
    from gnnc.runtime.probe_network import profile_fields

    def link(src, dst, same, bw):
        return {"src": src, "dst": dst, "same_host": same, "latency": 1e-4 if not same else 1e-5, "bandwidth": bw}

    measured = {"addresses": ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"],
                "links": [link(0, 1, True, 5e9), link(1, 0, True, 5e9), link(0, 2, False, 1.2e8),
                          link(2, 0, False, 1.1e8), link(1, 3, False, 1.3e8)],
                "collectives": [{"op": "all_reduce", "bytes": 1 << 24, "seconds": 0.3, "bandwidth": 1.0e8}]}
    fields = profile_fields(measured)
    assert (fields["workers"], fields["devices_per_node"]) == (4, 2)
    assert fields["inter_bandwidth"] == 1.2e8 and fields["intra_bandwidth"] == 5e9 and fields["latency"] == 1e-4
    profile = ClusterProfile.from_dict({**preset("g3").to_dict(), **fields})
    assert len(profile.links) == 5 and profile.collectives[0].op == "all_reduce"
    assert ClusterProfile.from_dict(json.loads(profile.to_json())) == profile
    with pytest.raises(GnncError, match="'links' entry 0: 'bandwidth'"):
        ClusterProfile.from_dict({**profile.to_dict(), "links": [link(0, 1, False, -1.0)]})


def test_a_slow_link_counts_in_the_latency_every_exchange_starts_with() -> None:
    """Every rank starts a message to each peer, so the profile's latency is the links' mean: two pairs of
    ranks sharing a core (2 ms, as measured on 4 emulated hosts on 2 cores) among fast links raise it."""
    from gnnc.runtime.probe_network import profile_fields

    slow = {(0, 2), (2, 0), (1, 3), (3, 1)}
    links = [{"src": i, "dst": j, "same_host": False, "latency": 2e-3 if (i, j) in slow else 4e-5, "bandwidth": 1.4e8}
             for i in range(4) for j in range(4) if i != j]
    fields = profile_fields({"addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], "links": links,
                             "collectives": []})
    assert fields["latency"] == pytest.approx((4 * 2e-3 + 8 * 4e-5) / 12)
    # an exchange that costs a step more than its start-ups (as on cores gloo's thread shares): its share per peer
    busy = profile_fields({"addresses": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], "links": links,
                           "collectives": [], "exchange_overhead": 9e-3})
    assert busy["latency"] == pytest.approx(3e-3)


def _probe_small(cfg: DistConfig):
    from gnnc.runtime import probe_network

    # 5 round trips for each median, not 60: the test checks what is measured, not how steady it is (a third
    # rank computes on 2 cores while each pair measures, so each of those round trips costs milliseconds)
    probe_network.SMALL_REPEATS = 5
    return probe_network.network_probe(cfg, nbytes=1 << 16, repeats=1)


def test_the_network_probe_measures_every_link_and_what_an_exchange_adds_to_a_step() -> None:
    """Three local ranks: each pair measures its link while the third computes, then all three time an
    exchange beside work. Every directed link gets a latency and a bandwidth; the exchange's overhead is a
    mean of seconds, and sets the profile's latency where it exceeds the links' (per peer)."""
    from gnnc.runtime.launch import launch
    from gnnc.runtime.probe_network import profile_fields

    results = launch(_probe_small, 3, timeout_s=120)
    assert results[1] is None and results[2] is None
    measured = results[0]
    links = measured["links"]
    assert sorted((x["src"], x["dst"]) for x in links) == [(i, j) for i in range(3) for j in range(3) if i != j]
    assert all(0 < x["latency"] < 1.0 and x["bandwidth"] > 0 for x in links)
    assert 0 <= measured["exchange_overhead"] < 1.0
    mean = sum(x["latency"] for x in links) / len(links)
    assert profile_fields(measured)["latency"] == pytest.approx(max(mean, measured["exchange_overhead"] / 2))


def test_probe_network_outside_torchrun_says_how_to_start_it(tmp_path, monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    r = gnnc_in_process("probe", "--network", "-o", str(tmp_path / "c.json"))
    assert r.returncode == 2 and "torchrun" in r.stderr and "Traceback" not in r.stderr


# --- with namespaces -----------------------------------------------------------------------------


def test_the_cluster_exists_inside_its_block_and_nowhere_after() -> None:
    need_cluster()
    links_before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with EmulatedCluster(3, "1gbit") as cluster:
        assert sorted(_namespaces(cluster.tag)) == sorted(cluster.namespaces)
        qdiscs = subprocess.run(["ip", "netns", "exec", cluster.switch, "tc", "qdisc", "show"], capture_output=True,
                                text=True).stdout
        assert qdiscs.count("tbf") == 3 and "rate 1Gbit" in qdiscs  # what each host receives
        for host in cluster.hosts:  # and what it sends
            own = subprocess.run(["ip", "netns", "exec", host.namespace, "tc", "qdisc", "show", "dev", "eth0"],
                                 capture_output=True, text=True).stdout
            assert "tbf" in own and "rate 1Gbit" in own, own
        # nothing of it appears in this machine's own namespace
        assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout == links_before
    assert _namespaces(cluster.tag) == []


def test_tbf_holds_a_host_to_its_link_rate() -> None:
    need_cluster()
    server = textwrap.dedent("""
        import socket
        s = socket.socket(); s.bind(("10.213.0.2", 5001)); s.listen(); c, _ = s.accept()
        while c.recv(1 << 20):
            pass
    """)
    client = textwrap.dedent("""
        import socket, time
        s = socket.create_connection(("10.213.0.2", 5001)); block = b"x" * (1 << 20); t = time.perf_counter()
        for _ in range(150):
            s.sendall(block)
        s.close(); print(150 * 8 * (1 << 20) / (time.perf_counter() - t) / 1e9)
    """)
    with EmulatedCluster(2, "1gbit") as cluster:
        sink = cluster.popen(1, [sys.executable, "-c", server])
        for _ in range(50):  # until it listens
            r = subprocess.run(cluster.command(0, [sys.executable, "-c", client]), capture_output=True, text=True)
            if r.returncode == 0:
                break
            time.sleep(0.1)
        sink.wait(timeout=30)
    gbit = float(r.stdout)
    assert 0.6 < gbit < 1.02, gbit  # TCP payload under a 1 Gb/s bucket (unshaped veth here: about 5 Gb/s)


def test_a_builder_stopped_mid_run_tears_everything_down(tmp_path) -> None:
    need_cluster()
    job = tmp_path / "job.py"
    job.write_text("import time\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "torchrun", "--hosts", "2", "--bandwidth", "1gbit", "--",
                             str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = f"{emulated.PREFIX}{proc.pid}-"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both hosts' torchrun agents have started their worker
        pids = _ns_pids(_namespaces(tag))
        cmdlines = [Path(f"/proc/{p}/cmdline").read_bytes() for p in pids if Path(f"/proc/{p}").exists()]
        if sum(c.startswith(sys.executable.encode()) and str(job).encode() in c and b"torch.distributed" not in c
               for c in cmdlines) == 2:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail(f"the job did not start: {proc.communicate()}")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "torn down" in err
    assert _namespaces(tag) == []
    assert not [p for p in pids if process_alive(p)], "a process of the cluster outlived its teardown"


def test_what_a_killed_builder_leaves_is_reaped() -> None:
    need_cluster()
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "up", "--hosts", "2"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("emulated cluster")
    tag = f"{emulated.PREFIX}{proc.pid}-"
    assert len(_namespaces(tag)) == 3
    proc.kill()  # SIGKILL: no teardown can run
    proc.wait()
    left = _namespaces(tag)
    assert len(left) == 3
    assert set(left) <= set(cleanup_stale())  # its builder is dead: the next cluster (or `cleanup`) reaps it
    assert _namespaces(tag) == []


_JOIN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    import torch.distributed as dist
    from gnnc.runtime.launch import join_torchrun

    def work(cfg, out_dir):
        t = torch.tensor([float(cfg.rank + 1)])
        dist.all_reduce(t)
        return {"rank": cfg.rank, "sum": t.item(), "gloo_ifname": cfg.gloo_ifname}

    out = join_torchrun(work, sys.argv[1], timeout_s=60)
    with open(os.path.join(sys.argv[1], f"rank{out['rank']}.json"), "w") as fh:
        json.dump(out, fh)
""")


def test_torchrun_across_two_hosts_makes_one_gloo_world(tmp_path) -> None:
    """c10d rendezvous on host 0; gloo on each host's namespace interface, not on the loopback that the
    shared hostname resolves to (gloo's own choice: "connectFullMesh failed ... remote=[127.0.0.1]")."""
    need_cluster()
    script = tmp_path / "job.py"
    script.write_text(_JOIN_SCRIPT)
    with EmulatedCluster(2, "1gbit") as cluster:
        results = cluster.run_torchrun([str(script), str(tmp_path)], timeout_s=120)
    assert results[0][0] == 0, results[0][2][-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"rank": r, "sum": 3.0, "gloo_ifname": "eth0"} for r in (0, 1)]


@pytest.mark.slow
def test_torchrun_across_two_hosts_trains_as_one_machine_does(tmp_path) -> None:
    """c10d rendezvous on host 0, gloo on each host's namespace address: the logits equal `--nproc 2`'s."""
    need_cluster()
    graph = "rmat:n=400,deg=4,features=16,classes=3,seed=1"
    plan = tmp_path / "plan"
    gnnc = [sys.executable, "-m", "gnnc"]
    r = subprocess.run([*gnnc, "compile", str(EXAMPLES / "gcn.gnn"), "--graph", graph, "--workers", "2",
                        "--strategy", "depcomm", "-o", str(plan)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*gnnc, "run", str(plan), "--nproc", "2", "--epochs", "3", "--dump-logits",
                        str(tmp_path / "local.pt")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    with EmulatedCluster(2, "1gbit") as cluster:
        results = cluster.run_torchrun(["-m", "gnnc", "run", str(plan), "--epochs", "3", "--dump-logits",
                                        str(tmp_path / "across.pt")], timeout_s=300)
    assert results[0][0] == 0, results[0][2][-3000:]
    import torch

    assert torch.equal(torch.load(tmp_path / "across.pt"), torch.load(tmp_path / "local.pt"))


# --- slow: the network probe, a dropped link, the smoke runner -------------------------------------


@pytest.mark.slow
def test_probe_network_measures_the_shaped_link(tmp_path) -> None:
    need_cluster()
    from gnnc import api
    from gnnc.cluster import load_profile, preset

    base = tmp_path / "base.json"
    preset("neutronstar-ecs").save(base)
    out = tmp_path / "cluster.json"
    with EmulatedCluster(2, "1gbit") as cluster:
        results = cluster.run_torchrun(["-m", "gnnc", "probe", "--network", "--base", str(base), "-o", str(out)],
                                       timeout_s=300)
    assert results[0][0] == 0, results[0][2][-3000:]
    profile = load_profile(out)
    assert profile.workers == 2 and profile.devices_per_node == 1
    assert [(x.src, x.dst, x.same_host) for x in profile.links] == [(0, 1, False), (1, 0, False)]
    assert 0.8e9 / 8 < profile.inter_bandwidth < 1.0e9 / 8  # shaped to 1 Gb/s
    assert 0 < profile.latency < 0.05 and {c.op for c in profile.collectives} == {"all_reduce", "all_to_all"}
    assert profile.gemm_rate == preset("neutronstar-ecs").gemm_rate  # the machines' figures from --base
    plan = api.compile(api.load_model(EXAMPLES / "gcn.gnn"), api.load_graph("rmat:n=300,deg=5,features=16,"
                       "classes=3,seed=0"), workers=2, cluster=str(out))
    assert plan.meta.planner.predicted_time_s > 0


def _worker_status(pid: int) -> int | None:
    """A worker's exit status once it has ended (a zombie's, read from /proc), None while it runs or when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[-1]) >> 8 if fields[0] == "Z" else None


@pytest.mark.slow
def test_a_dropped_link_stops_every_rank_naming_the_unreachable_peer(tmp_path) -> None:
    """Host 1's cable is pulled mid-run: both ranks exit 1 within the timeout plus the 2 s probe, each
    naming the other as unreachable (host 0's agent reports the failure; host 1's cannot reach its store)."""
    need_cluster()
    timeout_s = 10
    plan = tmp_path / "plan"
    r = subprocess.run([sys.executable, "-m", "gnnc", "compile", str(EXAMPLES / "gcn.gnn"), "--graph",
                        "rmat:n=2000,deg=5,features=32,classes=4,seed=0", "--workers", "2", "--strategy", "depcomm",
                        "-o", str(plan)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    metrics = tmp_path / "m.jsonl"
    lines: dict[int, list[tuple[float, str]]] = {0: [], 1: []}

    def read(k: int, stream) -> None:
        for line in stream:
            lines[k].append((time.monotonic(), line.rstrip()))

    with EmulatedCluster(2, "1gbit") as cluster:
        agents = cluster.start_torchrun(["-m", "gnnc", "run", str(plan), "--epochs", "100000", "--timeout",
                                         str(timeout_s), "--metrics", str(metrics)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for k, agent in enumerate(agents):
            threading.Thread(target=read, args=(k, agent.stdout), daemon=True).start()
        deadline = time.monotonic() + 120
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 10):
            assert time.monotonic() < deadline, lines
            time.sleep(0.2)
        workers = {k: [int(p) for p in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True,
                                                      text=True).stdout.split()] for k, agent in enumerate(agents)}
        assert all(len(w) == 1 for w in workers.values()), workers
        dropped = time.monotonic()
        cluster.set_link(1, up=False)

        def stopped(k: int) -> list[tuple[float, str]]:
            return [(t, line) for t, line in lines[k] if line.startswith("gnnc: rank")]

        while time.monotonic() < dropped + timeout_s + 30 and not (stopped(0) and stopped(1)):
            time.sleep(0.2)
        for k, peer in ((0, "rank 1 at 10.213.0.2"), (1, "rank 0 at 10.213.0.1")):
            assert stopped(k), f"host {k} said nothing:\n" + "\n".join(x for _, x in lines[k][-30:])
            when, message = stopped(k)[0]
            assert f"gnnc: rank {k} of 2 stops" in message and peer in message, message
            assert when - dropped < timeout_s + 5, (when - dropped, message)
        time.sleep(1.0)
        # each worker has exited 1: host 0's agent reaped it and reports it; host 1's (stuck on its
        # unreachable store) leaves it a zombie whose status /proc still shows
        assert agents[0].wait(timeout=30) != 0
        assert any("exitcode  : 1" in x for _, x in lines[0])
        status = _worker_status(workers[1][0])
        assert status == 1 or not process_alive(workers[1][0]), status


@pytest.mark.slow
def test_the_smoke_runner_measures_and_predicts_a_case(tmp_path) -> None:
    need_cluster()
    from gnnc.cluster import preset
    from runner import Case, measure_profile, run_case

    base = tmp_path / "base.json"
    preset("neutronstar-ecs").save(base)
    profile = measure_profile(2, "1gbit", tmp_path / "cluster.json", base)
    case = Case(str(EXAMPLES / "gcn.gnn"), "rmat:n=3000,deg=6,features=64,classes=4,seed=0", "1gbit",
                strategy="depcomm", epochs=4)
    row = run_case(case, profile, tmp_path)
    assert row["strategies"] == ["depcomm", "depcomm"]
    assert row["predicted_epoch_s"] > 0 and row["measured_epoch_s"] > 0
    assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0 and row["measured_peak_rss_bytes"] > 0


# --- the validation grid (benchmarks/cluster/grid.py) ----------------------------------------------


def _grid_rows() -> list[dict]:
    """Two cases differing only in the link: on the slow one caching wins (and is chosen), on the fast one DepComm."""
    import grid

    rows = []
    for bandwidth, times in ((grid.BANDWIDTHS[0], {"depcache": 1.0, "depcomm": 2.0}),
                             (grid.BANDWIDTHS[2], {"depcache": 1.0, "depcomm": 0.5})):
        case = grid.GridCase("rmat", "F>H", "gcn", 2, bandwidth)
        for k, (strategy, measured) in enumerate(sorted(times.items(), key=lambda kv: kv[1])):
            rows.append({"grid_case": dataclasses.asdict(case), "case_name": case.name, "chosen": k == 0,
                         "strategies": [strategy, strategy], "caches": strategy == "depcache",
                         "measured_epoch_s": measured,
                         "predicted_epoch_s": measured * (1.2 if k == 0 else 2.0), "measured_step_s": measured / 2,
                         "measured_eval_s": measured / 2, "predicted_bytes": 100, "measured_bytes": 100 + k,
                         "predicted_memory_bytes": 2**20, "measured_peak_rss_bytes": 2**21})
    return rows


def test_the_grid_summarises_its_cases() -> None:
    import grid

    rows = _grid_rows()
    s = grid.summary(rows)
    assert grid.summary_line(s) == ("planner: chosen within 10% of measured-fastest in 2/2; predicted within 25% in "
                                    "2/2; bytes exact in 0/2")
    rows[0]["measured_epoch_s"] = 2.5  # the choice now 25% slower than the other assignment
    assert grid.summary(rows)["A"] == 1
    assert grid.flips(_grid_rows()) == [(_grid_rows()[0]["case_name"], _grid_rows()[2]["case_name"])]
    hybrid = _grid_rows()
    for r in hybrid:  # a Hybrid that caches on the slow link and fetches everything on the fast one: a flip
        r["strategies"] = ["hybrid", "hybrid"] if r["caches"] else r["strategies"]
    assert grid.flips(hybrid) == grid.flips(_grid_rows())
    for r in hybrid:  # ... but one that fetches everything on both links is no move to caching
        r["caches"] = False
    assert grid.flips(hybrid) == []


def test_a_plan_replicates_when_a_layer_caches_or_a_hybrid_segment_caches_any_dependency() -> None:
    import copy

    from conftest import random_graph
    from gnnc import api
    from runner import replicates

    graph, model = random_graph(200, 1200, f=16, c=3, seed=3), api.load_model(EXAMPLES / "gcn.gnn", hidden=8)
    compiled = {s: api.compile(model, graph, workers=2, strategy=s, partition="metis")
                for s in ("depcache", "depcomm", "depcomm,depcache", "hybrid")}
    assert replicates(compiled["depcache"]) and replicates(compiled["depcomm,depcache"])
    assert not replicates(compiled["depcomm"])
    hybrid = compiled["hybrid"]
    segment = hybrid.meta.hybrid[0]
    assert replicates(hybrid) == any(c > 0 for layer in segment["cached_per_layer"] for c in layer)

    def with_cached(counts: list[list[int]]):
        plan = copy.copy(hybrid)
        plan.meta = dataclasses.replace(hybrid.meta, hybrid=[{**segment, "cached_per_layer": counts}])
        return plan

    nothing = [[0] * len(layer) for layer in segment["cached_per_layer"]]
    assert not replicates(with_cached(nothing)) and replicates(with_cached([[0, 1]] + nothing[1:]))


def test_the_grid_report_starts_with_its_summary_line(tmp_path) -> None:
    import grid

    rows = _grid_rows()
    meta = {"command": "grid.py", "cases": 2, "epochs": 5, "passes": 2, "wall_s": 60.0, "cpus": 2,
            "load_before": "1 1 1", "load_after": "2 2 2"}
    text = grid.report(rows, [{"workers": 2, "bandwidth": "400mbit", "link_bytes_per_s": 4e7, "latency_s": 5e-5,
                               "seconds": 30.0}], meta)
    assert text.splitlines()[0] == grid.summary_line(grid.summary(rows))
    assert "| gcn/rmat/F>H/x2/400mbit | depcache,depcache (chosen) (fastest) |" in text
    assert "load average before `1 1 1`, after `2 2 2`" in text
    assert "for 5 epochs on the emulated hosts, 2 times" in text
    grid.plot(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_plan_trains_first_in_one_pass_and_last_in_the_next() -> None:
    from run_plans import pass_order

    assert pass_order(3, 1) == [0, 1, 2]
    assert pass_order(3, 2) == [0, 1, 2, 2, 1, 0]
    assert pass_order(2, 3) == [0, 1, 1, 0, 0, 1]


def test_a_plans_times_are_the_medians_of_its_steady_epochs_over_every_pass() -> None:
    """Each pass's first epoch is a warm-up; the rest of both passes count alike, and the peak is the larger."""
    from run_plans import combined

    def summary(times: list[float], evals: list[float], peak: int) -> dict:
        history = [{"epoch": k, "time_s": t, "eval_time_s": e} for k, (t, e) in enumerate(zip(times, evals))]
        return {"plan": "p", "epoch_time_s": 0.0, "eval_time_s": 0.0, "peak_rss_bytes": peak, "history": history,
                "bytes_sent_per_epoch": 7}

    got = combined([summary([9.0, 1.0, 2.0, 3.0], [5.0, 0.1, 0.2, 0.3], 10),
                    summary([8.0, 4.0, 5.0, 6.0], [5.0, 0.4, 0.5, 0.6], 30)])
    assert got["epoch_time_s"] == 3.5 and got["eval_time_s"] == pytest.approx(0.35)
    assert got["peak_rss_bytes"] == 30 and got["passes"] == 2 and got["epochs_timed"] == 6
    assert got["bytes_sent_per_epoch"] == 7 and "history" not in got


def test_the_grid_covers_what_the_issue_asks() -> None:
    """At least 24 cases over three graph kinds, both width orders, three link speeds, 2 and 4 workers and
    GCN, SAGE and GAT, every base case at every speed (so a flip with the link can show)."""
    import grid

    cases = grid.CASES
    assert len(cases) >= 24 and len(set(cases)) == len(cases)
    assert {c.graph for c in cases} == {"rmat", "sbm", "cora"} and {c.widths for c in cases} == {"F>H", "F<H"}
    assert {c.workers for c in cases} == {2, 4} and {c.model for c in cases} == {"gcn", "sage", "gat"}
    assert {c.bandwidth for c in cases} == set(grid.BANDWIDTHS) and len(grid.BANDWIDTHS) == 3
    bases = {(c.graph, c.widths, c.model, c.workers) for c in cases}
    assert all({c.bandwidth for c in cases if (c.graph, c.widths, c.model, c.workers) == b} == set(grid.BANDWIDTHS)
               for b in bases)
    assert all(parse_rate(bw) < 5e9 for bw in grid.BANDWIDTHS)  # below what a veth pair moves here: they bind
    assert len(grid.SMOKE) == 3


@pytest.mark.slow
def test_the_grid_smoke_runs_and_counts_bytes_exactly(tmp_path) -> None:
    """`grid.py --smoke`: 3 cases on the emulated cluster, the grid's summary line last; every run's bytes (its
    step's and its evaluation's) equal what predict-bytes counted."""
    need_cluster()
    import re

    rows = tmp_path / "rows.jsonl"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cluster" / "grid.py"), "--smoke", "--json",
                        str(rows)], capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"planner: chosen within 10% of measured-fastest in (\d)/3; predicted within 25% in (\d)/3; "
                     r"bytes exact in (\d)/3", last)
    assert m and m.group(3) == "3", last
    for line in rows.read_text().splitlines():
        row = json.loads(line)
        assert row["predicted_bytes"] == row["measured_bytes"] and row["measured_epoch_s"] > 0
