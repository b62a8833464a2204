"""``trainperf doctor [--json]``: what this machine is and what to set, ready for a bug report.

The report (sections of aligned ``key : value`` lines, the GPU topology as a grid) comes from
:func:`trainperf.hardware.probe.probe`; the recommendations, each with its reason, from
:func:`trainperf.hardware.advice.advise`. torch is imported only when the command runs.
"""

from __future__ import annotations

import textwrap
from typing import Any

from trainperf.cli._common import add_json_flag, print_json

KEY_WIDTH = 18
WRAP = 100
TOPOLOGY_LEGEND = (
    "X = self; NV# = # NVLink links; PIX = one PCIe bridge; PXB = several PCIe bridges; "
    "PHB = PCIe host bridge; NODE = host bridges within a NUMA node; SYS = across NUMA nodes "
    "(CPU interconnect); P2P = peer access works, link type unknown without NVML"
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="describe this machine (CPUs, memory, GPUs, topology) and recommend settings",
        description="Describe this machine and recommend precision, loader, topology and NCCL "
        "settings, each with its reason. The text output is meant to be pasted into a bug report.",
    )
    add_json_flag(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    from trainperf.hardware.advice import advise
    from trainperf.hardware.probe import probe

    facts = probe()
    recs = [r.to_dict() for r in advise(facts)]
    if args.json:
        print_json(to_json(facts, recs))
    else:
        print(render(facts, recs))
    return 0


def to_json(facts: dict, recs: list[dict]) -> dict[str, Any]:
    machine = {k: v for k, v in facts.items() if k not in ("gpus", "topology")}
    return {"machine": machine, "gpus": facts.get("gpus", []), "topology": facts.get("topology", {}),
            "recommendations": recs}


# ---------------------------------------------------------------- text rendering


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 2**30:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**30:.1f} GiB"


def _v(x: Any) -> str:
    return "-" if x is None or x == "" else str(x)


def _line(key: str, value: Any) -> str:
    return f"{key:<{KEY_WIDTH}}: {_v(value)}"


def _section(title: str) -> str:
    return f"\n== {title} =="


def _grid(labels: list[str], matrix: list[list[str]]) -> list[str]:
    width = max([len(x) for x in labels] + [len(c) for row in matrix for c in row]) + 2
    rows = [" " * width + "".join(f"{x:<{width}}" for x in labels).rstrip()]
    for label, row in zip(labels, matrix):
        rows.append(f"{label:<{width}}" + "".join(f"{c:<{width}}" for c in row).rstrip())
    return rows


def _gpu_lines(g: dict) -> list[str]:
    head = f"GPU{g.get('index', '?')}"
    out = [_line(head, g.get("name"))]
    mem = f"{_size(g.get('memory_total_bytes'))} total, {_size(g.get('memory_used_bytes'))} used"
    out.append(_line("  memory", mem))
    cc = g.get("compute_capability")
    out.append(_line("  compute cap.", f"{_v(cc)} (bf16 {'yes' if g.get('bf16') else 'no'}, "
                                     f"tf32 {'yes' if g.get('tf32') else 'no'})"))
    if "sm_clock_mhz" in g:
        out.append(_line("  clocks MHz", f"SM {_v(g.get('sm_clock_mhz'))}/{_v(g.get('sm_clock_max_mhz'))} max, "
                                         f"memory {_v(g.get('mem_clock_mhz'))}/{_v(g.get('mem_clock_max_mhz'))} max"))
        out.append(_line("  power limit", f"{g['power_limit_w']:g} W" if g.get("power_limit_w") else None))
        out.append(_line("  PCIe", f"gen {_v(g.get('pcie_gen'))} x{_v(g.get('pcie_width'))} "
                                   f"(max gen {_v(g.get('pcie_gen_max'))} x{_v(g.get('pcie_width_max'))})"))
        out.append(_line("  bus id / NUMA", f"{_v(g.get('pci_bus_id'))} / node {_v(g.get('numa_node'))}"))
    for dt in ("bf16", "fp16"):
        if g.get(f"{dt}_dense_tflops"):
            extra = "" if dt == "bf16" else "; no BF16 tensor cores: train in fp16"
            out.append(_line(f"  dense {dt.upper()} peak",
                             f"{g[f'{dt}_dense_tflops']:g} TFLOP/s (catalog, no sparsity{extra})"))
    return out


def render(facts: dict, recs: list[dict]) -> str:
    h, c, m, shm, sw = (facts.get(k) or {} for k in ("host", "cpu", "memory", "shm", "software"))
    lines = ["trainperf doctor: paste this whole report into a bug report"]

    lines.append(_section("Host"))
    lines += [_line("hostname", h.get("hostname")), _line("OS", h.get("os")),
              _line("kernel", h.get("kernel")), _line("arch", h.get("arch"))]

    lines.append(_section("CPU"))
    nodes = c.get("numa_nodes") or []
    lines += [
        _line("model", c.get("model")),
        _line("logical CPUs", c.get("logical")),
        _line("usable CPUs", f"{_v(c.get('usable'))} ({_v(c.get('usable_reason'))})"),
        _line("NUMA nodes", f"{len(nodes)} (" + ", ".join(f"node{n['id']}: {n['cpus']} CPUs" for n in nodes) + ")"
              if nodes else None),
        _line("native bf16", "yes (AVX512-BF16/AMX)" if c.get("bf16_native") else "no"),
    ]

    lines.append(_section("Memory"))
    lines.append(_line("RAM", f"{_size(m.get('total_bytes'))} total, {_size(m.get('available_bytes'))} available"))
    small = "  <- small" if shm.get("small") else ""
    lines.append(_line(shm.get("path", "/dev/shm"),
                       f"{_size(shm.get('total_bytes'))} total, {_size(shm.get('free_bytes'))} free{small}"))

    lines.append(_section("Software"))
    be = sw.get("backends") or {}
    comp = sw.get("compile") or {}
    lines += [
        _line("python", sw.get("python")),
        _line("torch", sw.get("torch")),
        _line("CUDA (torch)", sw.get("cuda") or "- (CPU build)" if sw.get("torch") else None),
        _line("cuDNN", sw.get("cudnn")),
        _line("NCCL", sw.get("nccl")),
        _line("distributed", ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in be.items()) or None),
        _line("torch.compile", ("available: " if comp.get("available") else "unavailable: ") + _v(comp.get("reason"))
              + (f" ({comp['cxx']})" if comp.get("cxx") else "")),
        _line("packages", ", ".join(f"{k} {_v(v)}" for k, v in (facts.get("packages") or {}).items())),
    ]
    drv = facts.get("driver") or {}
    if drv:
        lines.append(_line("driver", f"{_v(drv.get('driver_version'))} (CUDA {_v(drv.get('cuda_driver_version'))})"))

    env = facts.get("env") or {}
    lines.append(_section("Environment"))
    lines += [_line(k, v) for k, v in env.items()] or ["(no NCCL_*, TORCH_NCCL_*, CUDA_* or related variables set)"]

    nics = facts.get("nics") or {}
    lines.append(_section("Network"))
    net = nics.get("net") or []
    lines.append(_line("interfaces", ", ".join(
        f"{i['name']} ({i.get('state')}{'' if i.get('physical') else ', virtual'}"
        + (f", {i['speed_mbps']} Mb/s" if i.get("speed_mbps") else "")
        + (f", NUMA {i['numa_node']}" if i.get("numa_node") is not None else "") + ")" for i in net) or None))
    lines.append(_line("default route", nics.get("default_route")))
    ib = nics.get("infiniband") or []
    lines.append(_line("InfiniBand", ", ".join(i["name"] for i in ib) or "none"))

    lines.append(_section("GPUs"))
    gpus = facts.get("gpus") or []
    source = facts.get("source")
    lines.append(_line("source", f"{source}" + (f" ({facts['nvml_note']})" if facts.get("nvml_note") else "")))
    if not gpus:
        lines.append("(no CUDA GPU visible)")
    for g in gpus:
        lines += _gpu_lines(g)

    topo = facts.get("topology") or {}
    if topo.get("matrix"):
        lines.append(_section(f"Topology (from {topo.get('source')})"))
        lines += _grid(topo["labels"], topo["matrix"])
        lines += textwrap.wrap("Legend: " + TOPOLOGY_LEGEND, WRAP)

    lines.append(_section("Recommendations"))
    for i, r in enumerate(recs, 1):
        lines.append(f"{i:>2}. {r['setting']} = {r['value']}   [{r['id']}]")
        lines += textwrap.wrap(r["reason"], WRAP, initial_indent="    why: ", subsequent_indent="         ")
    return "\n".join(lines)
