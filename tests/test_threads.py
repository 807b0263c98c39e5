"""The threads a run uses and the OpenMP wait policy it sets and reports (gnnc.host; issue 42).

The thread count comes from what the process may really use (its affinity mask, its cgroup's CPU quota, v2 or
v1, in a fake cgroup tree here), or `--threads`, and ranks on one machine share it; a run records it in
`--json` and its metrics, and that is the count torch trained with. OpenMP's waiting threads spin briefly, then
sleep, in a fresh gnnc process and the workers it spawns, unless the user set a wait policy: what libgomp really
read is what it prints under OMP_DISPLAY_ENV=verbose.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gnnc.cli import build_parser
from gnnc.host import (BLOCK_TIME, SHORT_SPIN, SMALL_EPOCH_ELEMENTS, SPIN_COUNT, WAIT_POLICY, _torch_openmp,
                       choose_threads, cpu_quota, set_wait_policy, usable_cpus, wait_policy)

ROOT = Path(__file__).resolve().parents[1]
FOUR = {0, 1, 2, 3}
WAIT_SETTINGS = (WAIT_POLICY, SPIN_COUNT, BLOCK_TIME)
libgomp = pytest.mark.skipif(_torch_openmp() != SPIN_COUNT, reason="torch here does not link libgomp")


def _user_env(**given: str) -> dict[str, str]:
    """This environment less every OpenMP wait setting (the test process's own gnnc import set one), plus `given`,
    with libgomp told to print the settings it read."""
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    return {**env, "OMP_DISPLAY_ENV": "verbose", **given}


def _spin_counts(stderr: str) -> list[str]:
    """The spin count each libgomp that loaded read (one line per process, OMP_DISPLAY_ENV=verbose)."""
    return [line.split("=")[1].strip().strip("'") for line in stderr.splitlines()
            if line.strip().startswith("GOMP_SPINCOUNT =")]


def _cgroup(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc (its self/cgroup) and cgroup mount holding `files` (path under the mount -> text)."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text(self_cgroup)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return proc, root


def test_the_affinity_mask_bounds_the_threads(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert usable_cpus(proc, root, affinity={2, 5}) == (2, "2 CPUs in this process's affinity mask")
    assert choose_threads(None, 1, proc, root, affinity={2, 5}).threads == 2
    assert usable_cpus(proc, root, affinity={0}) == (1, "1 CPU in this process's affinity mask")  # taskset -c 0
    # the real process: what sched_getaffinity says (taskset -c 0 gives 1)
    assert 1 <= choose_threads().threads <= len(os.sched_getaffinity(0))


def test_a_cgroup_v2_quota_bounds_the_threads_rounded_down(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "0::/job/step\n", {"job/cpu.max": "150000 100000\n",
                                                        "job/step/cpu.max": "max 100000\n"})
    choice = choose_threads(None, 1, proc, root, affinity=FOUR)
    assert choice.threads == 1  # 1.5 CPUs: a second thread would be throttled part of every period
    assert "1.5 CPUs" in choice.reason and str(root / "job" / "cpu.max") in choice.reason
    assert cpu_quota(proc / "self" / "cgroup", root) == (1.5, str(root / "job" / "cpu.max"))


def test_a_cgroup_v1_quota_bounds_the_threads(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n",
                         {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
                          "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert usable_cpus(proc, root, affinity=FOUR)[0] == 3
    # -1 is v1's "no quota"; a quota above the mask changes nothing; no cgroup file at all is no quota
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(proc / "self" / "cgroup", root) is None
    assert usable_cpus(tmp_path / "nowhere", root, affinity=FOUR)[0] == 4


def test_threads_asked_for_and_shared_between_ranks(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "0::/\n", {})
    assert choose_threads(3, 4, proc, root, affinity=FOUR) == choose_threads(3, 1, proc, root, affinity={0})
    assert choose_threads(3, 4, proc, root, affinity=FOUR).reason == "--threads 3"
    shared = [choose_threads(None, ranks, proc, root, affinity=FOUR).threads for ranks in (1, 2, 3, 4, 8)]
    assert shared == [4, 2, 1, 1, 1]  # floor(usable / ranks), at least 1: never more threads than cores
    assert "shared by 3 ranks" in choose_threads(None, 3, proc, root, affinity=FOUR).reason


def test_an_epoch_too_small_to_share_takes_one_thread(tmp_path: Path) -> None:
    proc, root = _cgroup(tmp_path, "0::/\n", {})
    small = choose_threads(None, 1, proc, root, affinity=FOUR, elements=SMALL_EPOCH_ELEMENTS - 1)
    assert small.threads == 1
    assert small.reason == ("1 thread of 4: the epoch's widest vertex tensor has 131,071 elements, under 131,072 a "
                            "second thread gains nothing (4 CPUs in this process's affinity mask)")
    assert choose_threads(None, 1, proc, root, affinity=FOUR, elements=SMALL_EPOCH_ELEMENTS).threads == 4
    assert choose_threads(2, 1, proc, root, affinity=FOUR, elements=10) == choose_threads(2, 1, proc, root)  # asked
    # one CPU: the mask is the reason, not the size
    one_cpu = choose_threads(None, 1, proc, root, affinity={0}, elements=10)
    assert one_cpu.reason == "1 CPU in this process's affinity mask"


def test_the_epoch_is_sized_by_its_widest_vertex_tensor() -> None:
    from gnnc import api

    cora = api.load_graph("planetoid:cora")
    gcn, gat = (api.compile(api.load_model(ROOT / "examples" / f"{m}.gnn"), cora) for m in ("gcn", "gat"))
    # GCN: 16 hidden, 7 classes, 1433 bag-of-words features of which 18.2 a vertex are nonzero (multiplied sparse)
    assert 2708 * 16 < api.epoch_elements(gcn, cora) == 49_216 < SMALL_EPOCH_ELEMENTS
    assert api.epoch_elements(gat, cora) == 2708 * 64  # 8 heads x 8
    assert api.epoch_elements(gcn, None) is None  # no graph in this process: the CPUs decide
    wide = api.load_graph("rmat:n=4000,deg=4,features=128,classes=4,seed=0")  # dense features
    assert api.epoch_elements(api.compile(api.load_model(ROOT / "examples" / "gcn.gnn"), wide), wide) == 4000 * 128
    # ranks: each one's share
    assert api.thread_settings(None, 2, 2 * SMALL_EPOCH_ELEMENTS - 2)["threads"] == 1


def test_a_small_epoch_runs_on_one_thread_and_says_why() -> None:
    """What `gnnc run --json` prints as threads and threads_reason (test_a_run_records_the_threads_it_trained_with
    reads them off the CLI's --json, with --threads)."""
    from gnnc import api

    cpus = len(os.sched_getaffinity(0))
    result = api.run(api.load_model(ROOT / "examples" / "gcn.gnn"), "planetoid:cora", epochs=1, threads="auto")
    assert result.threads == 1
    if cpus > 1:
        assert result.threads_reason == (
            f"1 thread of {cpus}: the epoch's widest vertex tensor has 49,216 elements, under 131,072 a second "
            f"thread gains nothing ({cpus} CPUs in this process's affinity mask)")


def test_taskset_is_honoured() -> None:
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    out = subprocess.run(["taskset", "-c", str(min(os.sched_getaffinity(0))), sys.executable, "-m", "gnnc.cli", "run",
                          "examples/gcn.gnn", "--graph", "planetoid:cora", "--epochs", "1", "--json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert (summary["threads"], summary["threads_reason"]) == (1, "1 CPU in this process's affinity mask")
    assert summary["wait_policy"] == "GOMP_SPINCOUNT=1000 (gnnc's default: spin briefly, then sleep)"


def test_the_threads_flag_takes_a_whole_number() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "m.gnn", "--threads", "2"]).threads == 2
    assert parser.parse_args(["probe", "--threads", "2"]).threads == 2
    for bad in ("0", "1.5", "inf"):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["run", "m.gnn", "--threads", bad])
        assert exit_.value.code == 2


def test_the_wait_policy_is_a_short_spin_unless_the_user_sets_one(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 00:00 1 /usr/lib/libc.so.6\n")
    env: dict[str, str] = {}
    set_wait_policy(env, maps)
    assert env == {SPIN_COUNT: SHORT_SPIN[SPIN_COUNT]} and SHORT_SPIN[SPIN_COUNT] == "1000"
    assert wait_policy(env) == "GOMP_SPINCOUNT=1000 (gnnc's default: spin briefly, then sleep)"
    for name, value in ((WAIT_POLICY, "active"), (SPIN_COUNT, "300000"), (BLOCK_TIME, "200")):
        user = {name: value}
        set_wait_policy(user, maps)
        assert user == {name: value}  # any runtime's setting is the user's choice: nothing added
        assert wait_policy(user) == f"{name}={value} (set by the user)"
    assert "default" in wait_policy({})


@libgomp
def test_a_fresh_gnnc_process_sets_it_before_openmp_loads() -> None:
    """What libgomp read in a fresh process that imports gnnc, then torch (the CLI's order): gnnc's short spin,
    or the user's policy as given; OpenMP's own default was 300,000 rounds."""
    code = "import gnnc, torch; from gnnc.host import wait_policy; print(wait_policy())"
    ours = subprocess.run([sys.executable, "-c", code], env=_user_env(), capture_output=True, text=True, timeout=120)
    assert ours.returncode == 0, ours.stderr
    assert _spin_counts(ours.stderr) == ["1000"]
    assert ours.stdout.strip() == "GOMP_SPINCOUNT=1000 (gnnc's default: spin briefly, then sleep)"
    users = subprocess.run([sys.executable, "-c", code], env=_user_env(OMP_WAIT_POLICY="active"),
                           capture_output=True, text=True, timeout=120)
    assert "OMP_WAIT_POLICY = 'ACTIVE'" in users.stderr and _spin_counts(users.stderr) == ["30000000000"]
    assert users.stdout.strip() == "OMP_WAIT_POLICY=active (set by the user)"


SPAWNING = """
import torch  # before gnnc: this process's OpenMP has read its default already
import gnnc
from gnnc.host import wait_policy
from gnnc.runtime.launch import launch


def policy(cfg):
    return wait_policy()


if __name__ == "__main__":
    print(wait_policy())
    print(launch(policy, 1, timeout_s=60))
"""


@libgomp
def test_spawned_workers_start_with_it_even_when_torch_came_first(tmp_path: Path) -> None:
    script = tmp_path / "spawning.py"
    script.write_text(SPAWNING)
    out = subprocess.run([sys.executable, str(script)], env=_user_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert sorted(_spin_counts(out.stderr)) == ["1000", "300000"]  # the worker's, then this process's
    caller, workers = out.stdout.strip().splitlines()[-2:]
    assert caller.endswith("this process loaded OpenMP before gnnc set it and keeps OpenMP's default")
    assert workers == str(["GOMP_SPINCOUNT=1000 (gnnc's default: spin briefly, then sleep)"])


SEEN_PLUGIN = '''
import json, os, sys
from pathlib import Path

import torch
from gnnc.runtime import train

step = train.train_step
seen = set()


def counting_step(*args, **kwargs):
    seen.add(torch.get_num_threads())
    Path(__file__).with_suffix(".json").write_text(json.dumps(sorted(seen)))
    return step(*args, **kwargs)


train.train_step = counting_step
'''


def test_a_run_records_the_threads_it_trained_with(tmp_path: Path) -> None:
    plugin = tmp_path / "seen.py"
    plugin.write_text(SEEN_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k not in WAIT_SETTINGS}
    out = subprocess.run([sys.executable, "-m", "gnnc.cli", "run", "examples/gcn.gnn", "--graph", "planetoid:cora",
                          "--epochs", "2", "--threads", "1", "--json", "--metrics", str(tmp_path / "m.jsonl"),
                          "--plugin", str(plugin)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert (summary["threads"], summary["threads_reason"]) == (1, "--threads 1")
    assert json.loads(plugin.with_suffix(".json").read_text()) == [1]  # torch's count in every training step
    assert summary["wait_policy"] == "GOMP_SPINCOUNT=1000 (gnnc's default: spin briefly, then sleep)"
    records = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert {r["extra"]["threads"] for r in records if "extra" in r} == {1}
