"""`trainperf doctor` on this machine, and its GPU part against a fake NVML.

The fake is a module object put in ``sys.modules["pynvml"]``; it answers the NVML calls that
trainperf.hardware.nvml makes, for a machine described as data (GPUs, NVLink links, PCIe levels).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from trainperf.cli import main
from trainperf.hardware import advice, cpu, nvml, probe

GiB = 2**30
A100 = {"name": "NVIDIA A100-SXM4-80GB", "cc": (8, 0), "mem": 80 * GiB, "power_mw": 400_000}
H100 = {"name": "NVIDIA H100 PCIe", "cc": (9, 0), "mem": 80 * GiB, "power_mw": 350_000}
V100 = {"name": "Tesla V100-SXM2-16GB", "cc": (7, 0), "mem": 16 * GiB, "power_mw": 300_000}


class FakeNVMLError(Exception):
    pass


def fake_nvml(gpus, links=None, level=None, *, init_error=None, switch_links=None):
    """A pynvml stand-in. ``gpus``: list of dicts (name, cc, mem, power_mw, numa).
    ``links``: {(i, j): n} NVLink links between GPU i and j (both directions).
    ``switch_links``: {i: n} links from GPU i to an NVSwitch.
    ``level(i, j)``: NVML topology level for a pair (default 40, NODE)."""
    links = links or {}
    switch_links = switch_links or {}
    level = level or (lambda i, j: 40)
    bus = [f"00000000:{0x07 + 0x10 * i:02X}:00.0" for i in range(len(gpus))]
    # NVLink remote PCI info gives the short domain form, as some drivers do.
    short_bus = [b[4:] for b in bus]
    per_gpu: list[list[object]] = [[] for _ in gpus]  # link index -> remote GPU index or "switch"
    for (i, j), n in links.items():
        per_gpu[i] += [j] * n
        per_gpu[j] += [i] * n
    for i, n in switch_links.items():
        per_gpu[i] += ["switch"] * n

    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 18
    m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
    m.calls = {"init": 0, "shutdown": 0}

    def init():
        if init_error:
            raise FakeNVMLError(init_error)
        m.calls["init"] += 1

    def shutdown():
        m.calls["shutdown"] += 1

    def link_target(h, link):
        if link >= len(per_gpu[h]):
            raise FakeNVMLError("Not Supported")
        return per_gpu[h][link]

    def common_ancestor(a, b):
        return level(a, b)

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: gpus[h]["name"].encode()  # old pynvml returns bytes
    m.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}"
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        total=gpus[h]["mem"], used=GiB // 2, free=gpus[h]["mem"] - GiB // 2)
    m.nvmlDeviceGetCudaComputeCapability = lambda h: gpus[h]["cc"]
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1410, 2: 1593}[kind]
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1410, 2: 1593}[kind]
    m.nvmlDeviceGetPowerManagementLimit = lambda h: gpus[h]["power_mw"]
    m.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    m.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 4
    m.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=bus[h].encode())
    m.nvmlDeviceGetNumaNodeId = lambda h: gpus[h].get("numa", 0)
    m.nvmlDeviceGetNvLinkState = lambda h, link: (link_target(h, link), 1)[1]
    m.nvmlDeviceGetNvLinkRemoteDeviceType = lambda h, link: 2 if link_target(h, link) == "switch" else 0
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId="ffff:ff:00.0" if link_target(h, link) == "switch" else short_bus[link_target(h, link)])
    m.nvmlDeviceGetTopologyCommonAncestor = common_ancestor
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=31)
    m.nvmlDeviceGetPowerUsage = lambda h: 312_500
    m.nvmlDeviceGetTemperature = lambda h, sensor: 61
    # nvmlDeviceGetNvLinkRemotePciInfo_v2 is absent on purpose: the adapter must fall back.
    return m


def run_doctor(capsys, *args):
    rc = main(["doctor", *args])
    out = capsys.readouterr().out
    return rc, out


def doctor_json(capsys):
    rc, out = run_doctor(capsys, "--json")
    assert rc == 0
    return json.loads(out)


def rec(report, rec_id):
    found = [r for r in report["recommendations"] if r["id"] == rec_id]
    assert found, f"no recommendation {rec_id!r} in {[r['id'] for r in report['recommendations']]}"
    return found[0]


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(__import__("os").environ):
        if k.startswith(probe.ENV_PREFIXES):
            monkeypatch.delenv(k)
    # The device-facing part must not depend on this machine's /dev/shm or NICs.
    monkeypatch.setattr(probe, "nic_facts", lambda: {"infiniband": [], "net": [], "default_route": None})


# ---------------------------------------------------------------- this machine


@pytest.fixture
def no_pynvml(monkeypatch, clean_env):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError


def test_doctor_json_on_this_machine(capsys, no_pynvml):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path")
    report = doctor_json(capsys)
    assert set(report) == {"machine", "gpus", "topology", "recommendations"}
    assert report["gpus"] == [] and report["topology"] == {}
    machine = report["machine"]
    assert machine["cpu"]["usable"] == cpu.usable_cpus()
    assert machine["software"]["torch"] == torch.__version__
    assert machine["software"]["backends"]["gloo"] is True
    assert machine["memory"]["total_bytes"] > 0
    assert machine["shm"]["total_bytes"] is not None
    assert "pip install 'trainperf[gpu]'" in machine["nvml_note"]
    for r in report["recommendations"]:
        assert set(r) == {"id", "setting", "value", "reason"} and r["reason"]
    assert rec(report, "precision")["value"] == "fp32"
    assert rec(report, "loader-workers")["value"] == cpu.loader_workers(1, cpu.usable_cpus())
    assert rec(report, "pin-memory")["value"] is False
    # No NCCL advice without a GPU.
    assert not any(r["id"].startswith("nccl") for r in report["recommendations"])
    assert "NCCL_ALLTOALL_THRESHOLD" not in json.dumps(report)


def test_doctor_text_on_this_machine(capsys, no_pynvml):
    rc, out = run_doctor(capsys)
    assert rc == 0
    for section in ("== Host ==", "== CPU ==", "== Memory ==", "== Software ==", "== GPUs ==", "== Recommendations =="):
        assert section in out
    usable = [line for line in out.splitlines() if line.startswith("usable CPUs")]
    assert usable and usable[0].split(":", 1)[1].strip().startswith(str(cpu.usable_cpus()))
    assert f"data.num_workers = {cpu.loader_workers(1, cpu.usable_cpus())}" in out
    assert "why: " in out


# ---------------------------------------------------------------- fake NVML: 4 A100 NVLink + 2 H100 PCIe


def mixed_machine():
    """GPUs 0-3: A100, NVLink (4 links) between every pair, NUMA 0. GPUs 4-5: H100 on PCIe,
    NUMA 1, under one host bridge; A100 <-> H100 crosses sockets (SYS)."""
    gpus = [dict(A100, numa=0) for _ in range(4)] + [dict(H100, numa=1) for _ in range(2)]
    links = {(i, j): 4 for i in range(4) for j in range(i + 1, 4)}

    def level(i, j):
        if {i, j} == {4, 5}:
            return 30  # PHB
        return 50 if (i < 4) != (j < 4) else 40

    return fake_nvml(gpus, links, level)


def test_fake_nvml_gpus_and_topology(capsys, monkeypatch, clean_env):
    fake = mixed_machine()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    report = doctor_json(capsys)
    gpus = report["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA A100-SXM4-80GB"] * 4 + ["NVIDIA H100 PCIe"] * 2
    assert [g["compute_capability"] for g in gpus] == ["8.0"] * 4 + ["9.0"] * 2
    assert all(g["bf16"] and g["tf32"] for g in gpus)
    assert gpus[0]["memory_total_bytes"] == 80 * GiB and gpus[0]["memory_used_bytes"] == GiB // 2
    assert gpus[0]["power_limit_w"] == 400 and gpus[4]["power_limit_w"] == 350
    assert gpus[0]["pci_bus_id"] == "0000:07:00.0"
    assert (gpus[0]["pcie_gen"], gpus[0]["pcie_width"]) == (4, 16)
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1]
    assert report["machine"]["source"] == "nvml"
    try:  # the catalog is optional for doctor; when present, dense peaks (REFERENCE.md: A100 312)
        import trainperf.hardware.catalog  # noqa: F401

        assert gpus[0]["bf16_dense_tflops"] == 312
    except ImportError:
        assert "bf16_dense_tflops" not in gpus[0]
    assert report["machine"]["driver"]["cuda_driver_version"] == "12.4"
    assert fake.calls == {"init": 1, "shutdown": 1}

    topo = report["topology"]
    assert topo["labels"] == [f"GPU{i}" for i in range(6)]
    assert topo["matrix"] == [
        ["X", "NV4", "NV4", "NV4", "SYS", "SYS"],
        ["NV4", "X", "NV4", "NV4", "SYS", "SYS"],
        ["NV4", "NV4", "X", "NV4", "SYS", "SYS"],
        ["NV4", "NV4", "NV4", "X", "SYS", "SYS"],
        ["SYS", "SYS", "SYS", "SYS", "X", "PHB"],
        ["SYS", "SYS", "SYS", "SYS", "PHB", "X"],
    ]

    assert rec(report, "precision")["value"] == "bf16"
    tp = rec(report, "topology")
    assert tp["setting"] == "parallelism.tensor" and tp["value"] == "<= 4"
    assert "NVLink islands [[0, 1, 2, 3]], each fully connected" in tp["reason"]
    assert "GPUs [4, 5] have no NVLink" in tp["reason"] and "daisy chain" not in tp["reason"]
    numa = rec(report, "numa")
    assert "node 0: GPUs [0, 1, 2, 3]" in numa["reason"] and "node 1: GPUs [4, 5]" in numa["reason"]
    assert rec(report, "pin-memory")["value"] is True
    assert rec(report, "nccl-async-error-handling")["value"] == 1
    assert rec(report, "nccl-debug")["value"] == "WARN"
    assert "diagnosis only" in rec(report, "nccl-p2p-disable")["value"]
    assert report["machine"]["local_ranks"] == 6
    assert rec(report, "loader-workers")["value"] == cpu.loader_workers(6, cpu.usable_cpus())


def test_fake_nvml_text_grid(capsys, monkeypatch, clean_env):
    monkeypatch.setitem(sys.modules, "pynvml", mixed_machine())
    rc, out = run_doctor(capsys)
    assert rc == 0
    lines = out.splitlines()
    start = lines.index("== Topology (from nvml) ==")
    header = lines[start + 1].split()
    assert header == [f"GPU{i}" for i in range(6)]
    assert lines[start + 2].split() == ["GPU0", "X", "NV4", "NV4", "NV4", "SYS", "SYS"]
    assert lines[start + 6].split() == ["GPU4", "SYS", "SYS", "SYS", "SYS", "X", "PHB"]
    # columns line up: every cell of a row starts where the header's label starts
    col = lines[start + 1].index("GPU5")
    assert lines[start + 7][col:].strip() == "X"
    assert "NVIDIA H100 PCIe" in out and "8.0 (bf16 yes, tf32 yes)" in out


# ---------------------------------------------------------------- other shapes


def facts_for(monkeypatch, fake):
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return probe.probe()


def test_two_h100_pcie_only_keeps_tensor_parallel_off(monkeypatch, clean_env):
    facts = facts_for(monkeypatch, fake_nvml([H100, H100], level=lambda i, j: 30))
    assert facts["topology"]["matrix"] == [["X", "PHB"], ["PHB", "X"]]
    recs = {r.id: r for r in advice.advise(facts)}
    assert recs["topology"].value == 1
    assert "no NVLink" in recs["topology"].reason and "PHB" in recs["topology"].reason


def test_daisy_chain_vs_fully_connected(monkeypatch, clean_env):
    chain = {(i, i + 1): 2 for i in range(7)}  # 8 GPUs, 0-1-2-...-7
    facts = facts_for(monkeypatch, fake_nvml([A100] * 8, chain))
    assert facts["topology"]["matrix"][0][:3] == ["X", "NV2", "NODE"]
    recs = {r.id: r for r in advice.advise(facts)}
    assert recs["topology"].value == "<= 2"
    assert "daisy chain" in recs["topology"].reason and "27%" in recs["topology"].reason

    full = {(i, j): 1 for i in range(4) for j in range(i + 1, 4)}
    facts = facts_for(monkeypatch, fake_nvml([A100] * 4, full))
    recs = {r.id: r for r in advice.advise(facts)}
    assert recs["topology"].value == "<= 4" and "fully connected" in recs["topology"].reason


def test_nvswitch_counts_as_fully_connected(monkeypatch, clean_env):
    facts = facts_for(monkeypatch, fake_nvml([A100] * 8, switch_links={i: 12 for i in range(8)}))
    matrix = facts["topology"]["matrix"]
    assert all(matrix[i][j] == ("X" if i == j else "NV12") for i in range(8) for j in range(8))
    assert facts["topology"]["nvswitch"] is True
    recs = {r.id: r for r in advice.advise(facts)}
    assert recs["topology"].value == "<= 8" and "NVSwitch" in recs["topology"].reason


def test_v100_gets_fp16_with_loss_scaling(monkeypatch, clean_env):
    facts = facts_for(monkeypatch, fake_nvml([V100]))
    assert facts["gpus"][0]["bf16"] is False
    recs = {r.id: r for r in advice.advise(facts)}
    assert recs["precision"].value == "fp16" and "GradScaler" in recs["precision"].reason
    assert "tf32" not in recs
    assert "topology" not in recs  # one GPU: no matrix, no topology advice


def test_sampler_reads_monitoring_fields(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([A100]))
    with nvml.session():
        s = nvml.sample(nvml.handles()[0])
    assert s["gpu_util_pct"] == 97 and s["mem_copy_util_pct"] == 31
    assert s["power_w"] == 312.5 and s["sm_clock_mhz"] == 1410 and s["temperature_c"] == 61


# ---------------------------------------------------------------- NVML failing


def test_driver_missing_falls_back_cleanly(capsys, monkeypatch, clean_env):
    import torch

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([A100], init_error="Driver Not Loaded"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    report = doctor_json(capsys)
    assert report["gpus"] == [] and report["machine"]["source"] == "none"
    assert "NVML could not start (Driver Not Loaded)" in report["machine"]["nvml_note"]
    assert rec(report, "precision")["value"] == "fp32"
    rc, out = run_doctor(capsys)
    assert rc == 0 and "Driver Not Loaded" in out


def test_nvml_failing_after_init_falls_back(monkeypatch, clean_env):
    import torch

    fake = fake_nvml([A100, A100])

    def broken():
        raise FakeNVMLError("GPU is lost")

    fake.nvmlDeviceGetCount = broken
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    facts = probe.probe()
    assert facts["gpus"] == [] and "GPU is lost" in facts["nvml_note"]
    assert fake.calls["shutdown"] == 1  # the session still shut NVML down


def test_unsupported_fields_become_none(monkeypatch, clean_env):
    fake = fake_nvml([A100])

    def unsupported(*a):
        raise FakeNVMLError("Not Supported")

    fake.nvmlDeviceGetPowerManagementLimit = unsupported
    del fake.nvmlDeviceGetNumaNodeId  # an old pynvml without it
    facts = facts_for(monkeypatch, fake)
    g = facts["gpus"][0]
    assert g["power_limit_w"] is None and g["name"] == "NVIDIA A100-SXM4-80GB"


# ---------------------------------------------------------------- advice invariants


@pytest.mark.parametrize("env", [{}, {"NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_ALLTOALL_THRESHOLD": "65536",
                                      "NVIDIA_TF32_OVERRIDE": "0"}])
def test_only_documented_env_variables_are_recommended(monkeypatch, clean_env, env):
    fake = mixed_machine()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    facts = facts_for(monkeypatch, fake)
    facts["nics"] = {"infiniband": [{"name": "mlx5_0"}, {"name": "mlx5_1"}],
                     "net": [{"name": "eth0", "physical": True, "state": "up"},
                             {"name": "ib0", "physical": True, "state": "up"}],
                     "default_route": "eth0"}
    recs = advice.advise(facts)
    env_recs = [r for r in recs if r.is_env]
    assert {r.setting for r in env_recs} >= {"NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_P2P_DISABLE",
                                             "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"}
    for r in env_recs:
        assert r.setting in advice.ENV_VARIABLES, r.setting
    text = json.dumps([r.to_dict() for r in recs])
    assert "NCCL_ALLTOALL_THRESHOLD" not in text
    byid = {r.id: r for r in recs}
    assert byid["nccl-async-error-handling"].value == 1
    assert byid["nccl-ib-hca"].value == "mlx5_0,mlx5_1"
    assert byid["nccl-socket-ifname"].value == "eth0"
    if env:
        assert "set to 0 now" in byid["nccl-async-error-handling"].reason
        assert byid["tf32-override"].value == "unset"
    else:
        assert "tf32-override" not in byid


def test_env_table_is_complete_and_excludes_invented_names():
    assert "NCCL_ALLTOALL_THRESHOLD" not in advice.ENV_VARIABLES
    assert "NCCL_ASYNC_ERROR_HANDLING" not in advice.ENV_VARIABLES  # deprecated name, TORCH_ prefix now
    for name, entry in advice.ENV_VARIABLES.items():
        assert entry["meaning"] and entry["source"], name
    assert advice.Recommendation("x", "NCCL_MADE_UP", 1, "r").is_env
    assert not advice.Recommendation("x", "data.num_workers", 1, "r").is_env


def test_small_shm_is_flagged_with_size_needed():
    facts = {"cpu": {"usable": 16, "usable_reason": "test"}, "local_ranks": 2, "gpus": [],
             "shm": {"total_bytes": 64 * 2**20, "free_bytes": 64 * 2**20, "small": True}}
    recs = {r.id: r for r in advice.loader_advice(facts)}
    assert recs["loader-workers"].value == 8
    assert "oversubscribed" in recs["loader-workers"].reason  # 2 x 16 per rank x 2 ranks on 16 CPUs
    # 2 ranks x 8 workers x prefetch 3 x 64 MiB = 3 GiB
    assert recs["shm"].value.startswith(">= 3 GiB") and "Docker's default is 64 MB" in recs["shm"].reason
    facts["shm"] = {"total_bytes": 32 * GiB, "free_bytes": 32 * GiB, "small": False}
    assert "shm" not in {r.id for r in advice.loader_advice(facts)}


def test_shm_facts_marks_small(tmp_path, monkeypatch):
    monkeypatch.setattr(probe.shutil, "disk_usage", lambda p: types.SimpleNamespace(
        total=64 * 2**20, used=0, free=64 * 2**20))
    assert probe.shm_facts()["small"] is True


def test_torch_cuda_fallback_without_nvml(monkeypatch, no_pynvml):
    import torch

    props = types.SimpleNamespace(name="NVIDIA H200", major=9, minor=0, total_memory=140 * GiB)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (139 * GiB, 140 * GiB))
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: True)
    facts = probe.gpu_facts()
    assert facts["source"] == "torch.cuda" and "not installed" in facts["nvml_note"]
    assert [g["compute_capability"] for g in facts["gpus"]] == ["9.0", "9.0"]
    assert facts["gpus"][0]["memory_used_bytes"] == GiB and facts["gpus"][0]["bf16"] is True
    assert facts["topology"]["matrix"] == [["X", "P2P"], ["P2P", "X"]]
    recs = {r.id: r for r in advice.topology_advice({**facts, "gpus": facts["gpus"]})}
    assert recs["topology"].setting == "nvidia-ml-py"  # link type unknown: ask for NVML first


@pytest.mark.parametrize("env,rid,says", [
    ({"OMP_NUM_THREADS": "-5"}, "omp-num-threads", "it is set to '-5', which is not a thread count"),
    ({"OMP_NUM_THREADS": "two"}, "omp-num-threads", "it is set to 'two'"),
    ({"NCCL_IB_DISABLE": "maybe"}, "nccl-ib-disable", "it is set to 'maybe'"),
    ({"NCCL_SOCKET_IFNAME": "bogus0"}, "nccl-socket-ifname-missing", "matches none of this machine's interfaces (eth0, ib0)"),
])
def test_set_env_variables_that_cannot_work_are_named(env, rid, says):
    """doctor listed OMP_NUM_THREADS=-5, NCCL_IB_DISABLE=maybe and NCCL_SOCKET_IFNAME=bogus0 without a word."""
    facts = {"env": env, "nics": {"net": [{"name": "eth0"}, {"name": "ib0"}]}}
    recs = {r.id: r for r in advice.env_advice(facts)}
    assert rid in recs and says in recs[rid].reason
    assert recs[rid].setting in advice.ENV_VARIABLES


@pytest.mark.parametrize("env", [{"OMP_NUM_THREADS": "4"}, {"NCCL_IB_DISABLE": "1"}, {"NCCL_SOCKET_IFNAME": "eth"},
                                 {"NCCL_SOCKET_IFNAME": "=ib0"}, {"NCCL_SOCKET_IFNAME": "^docker,lo"}, {}])
def test_good_env_values_get_no_warning(env):
    assert advice.env_advice({"env": env, "nics": {"net": [{"name": "eth0"}, {"name": "ib0"}]}}) == []
