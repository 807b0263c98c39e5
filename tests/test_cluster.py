"""Cluster profiles: presets pinned to their datasheets, JSON round trips, validation that names the field."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from gnnc.cluster import (GB, GBIT, GIB, PRESET_NAMES, TFLOPS, ClusterProfile, list_presets, load_cluster,
                          load_profile, preset)
from gnnc.errors import GnncError

NAMED = [n for n in PRESET_NAMES if n != "local"]


def test_preset_names_are_those_of_the_design() -> None:
    assert set(PRESET_NAMES) == {"p3", "neutronstar-ecs", "neutronstar-ecs16", "neutronstar-ibv", "g3",
                                 "gnnpipe", "dgx1", "dgx-a100", "local"}


# Figures copied from the public specifications the presets cite; a change to a preset must change
# this table too, on purpose, with its source (presets are never tuned to a planner decision).
DATASHEET = {
    #                 workers, per node, FP32 TFLOPS, memory GiB, memory GB/s, network (bytes/s)
    "p3": (16, 4, 9.3, 16, 732, 10 * GBIT),
    "neutronstar-ecs": (8, 1, 8.1, 16, 320, 6 * GBIT),
    "neutronstar-ecs16": (16, 1, 8.1, 16, 320, 6 * GBIT),
    "neutronstar-ibv": (8, 1, 14.0, 16, 900, 100 * GBIT),
    "g3": (16, 1, 35.6, 24, 936, 10 * GBIT),
    "gnnpipe": (8, 4, 27.8, 24, 768, 200 * GBIT),
    "dgx1": (8, 8, 15.7, 16, 900, 150 * GB),
    "dgx-a100": (8, 8, 19.5, 40, 1555, 300 * GB),
}


@pytest.mark.parametrize("name", NAMED)
def test_preset_figures_match_their_sources(name: str) -> None:
    p = preset(name)
    workers, per_node, tflops, mem_gib, mem_gbs, network = DATASHEET[name]
    assert (p.workers, p.devices_per_node) == (workers, per_node)
    assert p.gemm_rate == pytest.approx(tflops * TFLOPS)
    assert p.memory_per_worker == mem_gib * GIB
    assert p.memory_bandwidth == pytest.approx(mem_gbs * GB)
    assert p.spmm_rate == pytest.approx(p.memory_bandwidth / 4)  # memory-bound FP32 SpMM
    link = p.inter_bandwidth if p.devices_per_node < p.workers else p.intra_bandwidth
    assert link == pytest.approx(network)
    assert p.name == name and p.description


def test_gnnpipe_runs_pcie4_inside_a_machine() -> None:
    assert preset("gnnpipe").intra_bandwidth == pytest.approx(31.5e9, rel=1e-3)
    assert preset("p3").intra_bandwidth == pytest.approx(15.75e9, rel=1e-3)


@pytest.mark.parametrize("name", NAMED)
def test_preset_json_round_trip(name: str, tmp_path) -> None:
    p = preset(name)
    path = tmp_path / f"{name}.json"
    p.save(path)
    assert load_profile(path) == p
    assert json.loads(path.read_text())["version"] == 1
    assert load_cluster(str(path)) == p
    assert load_cluster(name) == p


def test_list_presets_covers_every_name_and_local(tmp_path) -> None:
    listed = list_presets(probe_file=tmp_path / "absent.json")
    assert [n for n, _ in listed] == list(PRESET_NAMES)
    assert "gnnc probe" in dict(listed)["local"]


def test_local_reads_the_probe_file(tmp_path) -> None:
    probe = tmp_path / "probe.json"
    with pytest.raises(GnncError, match="gnnc probe"):
        preset("local", probe_file=probe)
    measured = replace(preset("neutronstar-ecs"), name="this-box", workers=2, devices_per_node=2,
                       t_v=1e-12, t_e=2e-11, t_c=1e-9)
    measured.save(probe)
    local = preset("local", probe_file=probe)
    assert local.name == "local" and local.workers == 2 and local.t_e == 2e-11
    assert dict(list_presets(probe_file=probe))["local"].startswith("this machine, measured")


def _valid() -> dict:
    return preset("g3").to_dict()


@pytest.mark.parametrize("field,value,message", [
    ("inter_bandwidth", -1.0, "field 'inter_bandwidth' must be a positive number"),
    ("intra_bandwidth", 0, "field 'intra_bandwidth' must be a positive number"),
    ("gemm_rate", "fast", "field 'gemm_rate' must be a number"),
    ("workers", 2.5, "field 'workers' must be an integer"),
    ("workers", True, "field 'workers' must be an integer"),
    ("workers", 0, "field 'workers' must be at least 1"),
    ("latency", -1e-6, "field 'latency' must be a non-negative number"),
    ("memory_per_worker", float("inf"), "field 'memory_per_worker' must be a positive number"),
    ("t_c", 0.0, "field 't_c' must be a positive number"),
    ("topology", "", "field 'topology' must not be empty"),
    ("version", 2, "field 'version'"),
])
def test_bad_field_is_named(field: str, value, message: str, tmp_path) -> None:
    data = _valid()
    data[field] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(GnncError) as err:
        load_profile(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_and_missing_fields_are_named() -> None:
    data = _valid()
    data["bandwith"] = 1.0
    with pytest.raises(GnncError, match="unknown field 'bandwith'"):
        ClusterProfile.from_dict(data)
    data = _valid()
    del data["spmm_rate"]
    with pytest.raises(GnncError, match="missing field 'spmm_rate'"):
        ClusterProfile.from_dict(data)
    data = _valid()
    del data["t_v"]  # optional: defaults to None
    assert ClusterProfile.from_dict(data).t_v is None


def test_unreadable_profiles(tmp_path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(GnncError, match="not valid JSON"):
        load_profile(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(GnncError, match="expected a JSON object"):
        load_profile(bad)
    with pytest.raises(GnncError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(GnncError, match="neither a preset"):
        load_cluster("no-such-cluster")
    with pytest.raises(GnncError, match="unknown cluster preset"):
        preset("dgx2")


def test_constructor_validates_too() -> None:
    with pytest.raises(GnncError, match="field 'spmm_rate'"):
        replace(preset("p3"), spmm_rate=-5.0)


def test_worker_bandwidth_mixes_intra_and_inter_node_shares() -> None:
    p3 = preset("p3")
    # 16 workers, 4 per machine: 3 of 15 peers on the same machine, the rest through a 10 Gb/s
    # link shared by 4 workers
    expect = 1 / ((3 / 15) / p3.intra_bandwidth + (12 / 15) / (10 * GBIT / 4))
    assert p3.worker_bandwidth() == pytest.approx(expect)
    assert p3.worker_bandwidth(4) == p3.intra_bandwidth  # one machine
    assert p3.worker_bandwidth(1) == p3.intra_bandwidth
    ecs = preset("neutronstar-ecs")
    assert ecs.worker_bandwidth() == pytest.approx(6 * GBIT)  # one GPU per machine: the whole link
    assert preset("dgx-a100").worker_bandwidth(8) == 300 * GB
    # more workers per machine never makes a worker's share faster when the network is the bottleneck
    assert p3.worker_bandwidth(8) > p3.worker_bandwidth(16)


def test_for_workers_and_nodes() -> None:
    p3 = preset("p3")
    assert p3.nodes == 4 and p3.for_workers(8).workers == 8
    with pytest.raises(GnncError, match="field 'workers'"):
        p3.for_workers(32)
    with pytest.raises(GnncError, match="positive integer"):
        p3.for_workers(0)


def test_measured_constants_override_rates() -> None:
    p = replace(preset("neutronstar-ecs"), t_v=1e-12, t_e=4e-11, t_c=2e-9)
    assert p.effective_gemm_rate == pytest.approx(2e12)
    assert p.effective_spmm_rate == pytest.approx(2.5e10)
    assert p.effective_bandwidth() == pytest.approx(5e8)
    plain = preset("neutronstar-ecs")
    assert plain.effective_gemm_rate == plain.gemm_rate
    assert math.isclose(plain.effective_bandwidth(), plain.worker_bandwidth())
