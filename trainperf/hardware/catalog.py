"""Hardware catalog: dense peaks, memory and interconnect of the devices trainperf plans for.

Pure Python (no torch). Used by the planner (``trainperf plan``), by MFU in the monitor and by
``doctor``: they look a device up by catalog key (``a100-80gb``) or by the name NVML/torch
reports (``"NVIDIA A100-SXM4-80GB"``, ``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA H200"``) with
:func:`lookup_gpu`.

Peaks are **dense** tensor-core figures (never the 2:4-sparsity ones): A100 312 BF16 TFLOP/s,
H100/H200 SXM 989 (the 1,979 often quoted for H100 is the sparse figure). A part without BF16
tensor cores (V100) has ``bf16_tflops`` 0 and trains in FP16 (:attr:`GPUSpec.half_dtype`).
Sources: NVIDIA V100 / A100 / H100 / H200 / B200 / L40S / L4 and AMD MI250X / MI300X
datasheets; InfiniBand per GPU: HDR 200 Gb/s on DGX A100, NDR 400 Gb/s on DGX H100/H200 (see
REFERENCE.md). Bandwidths are in GB/s = 1e9 bytes/s; ``nvlink_gbps`` is the
total (both directions) per GPU as NVIDIA quotes it, ``internode_gbps`` one direction per GPU.

Extend it with a YAML file (``trainperf plan --catalog FILE``)::

    gpus:
      my-h100-roce:          # a new key, or an existing one to override fields
        base: h100-sxm       # optional: start from an existing entry
        internode_gbps: 25
        aliases: ["NVIDIA H100 80GB HBM3 (RoCE cluster)"]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

from trainperf.errors import ConfigError, UserError


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator (or a CPU socket) as the planner and MFU see it."""

    key: str
    """Catalog key, e.g. ``a100-80gb``."""
    name: str
    """Marketing / NVML name."""
    bf16_tflops: float
    """Dense BF16 tensor-core peak, TFLOP/s (FP16 dense is the same on these parts)."""
    fp16_tflops: float
    """Dense FP16 tensor-core peak, TFLOP/s."""
    tf32_tflops: float
    """Dense TF32 tensor-core peak, TFLOP/s."""
    fp32_tflops: float
    """FP32 (non-tensor-core) peak, TFLOP/s."""
    hbm_gib: float
    """Device memory in GiB as the driver reports it (A100 80GB = 80 GiB)."""
    hbm_tbps: float
    """Device memory bandwidth, TB/s."""
    nvlink_gbps: float
    """Intra-node GPU-to-GPU bandwidth per GPU, GB/s, both directions summed (NVLink; PCIe when
    there is no NVLink)."""
    internode_gbps: float
    """Inter-node bandwidth per GPU, one direction, GB/s (one HDR/NDR NIC per GPU on DGX)."""
    gpus_per_node: int
    """Devices sharing the fast intra-node fabric."""
    sms: int = 0
    """Streaming multiprocessors (0 when not applicable)."""
    gemm_fraction: float = 0.80
    """Fraction of the dense peak a large, well-shaped BF16 GEMM sustains on this part (clocks
    under the power limit, tile efficiency): a property of the hardware measured by one GEMM, not
    of a training run. A100: 0.88 (sustained clock 1305 of 1410 MHz under the power limit, the
    HPL figure NVIDIA uses, times ~0.95 tile efficiency); H100/H200 SXM: 0.79 (measured bf16
    8192^3 matmul on H200: 770-798 of 989 TFLOP/s, REFERENCE.md; same die and clocks as H100).
    The planner multiplies it by its shape- and stack-dependent efficiencies."""
    aliases: tuple[str, ...] = ()
    """Extra exact names (case-insensitive) that map to this entry."""
    note: str = ""
    fp8_tflops: float = 0.0
    """Dense FP8 tensor-core peak, TFLOP/s (0: no FP8 tensor cores; H100/H200 SXM: 1,979)."""
    fabric: str = "NVLink"
    """What carries ``nvlink_gbps`` between the GPUs of a node: NVLink, PCIe or Infinity Fabric."""
    mma_sync_fraction: float = 1.0
    """Fraction of the dense tensor-core peak that warp-level ``mma.sync`` instructions (what kernels
    written for Ampere use) can reach: 1 where they are the native path (Volta, Ampere, Ada); 2/3 on
    Hopper, whose peak needs the warpgroup ``wgmma`` instructions (Shah et al. 2024, FlashAttention-3,
    arXiv 2407.08608, sect. 2: "mma.sync can only reach 2/3 of the peak throughput of the H100 Tensor
    Cores"). FlashAttention-2, PyTorch SDPA's flash / memory-efficient backends and xformers run their
    matmuls at this fraction on Hopper (the planner's ``--attention-kernel fa2``)."""

    def peak_tflops(self, dtype: str = "bf16") -> float:
        """Dense peak for a precision: bf16, fp16, tf32 or fp32. A precision the part has no tensor
        cores for (BF16 and TF32 on a V100) is an error that says which one to use."""
        table = {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "tf32": self.tf32_tflops, "fp32": self.fp32_tflops}
        if dtype not in table:
            raise ConfigError(f"precision {dtype!r} has no peak in the catalog; choose one of {', '.join(table)}")
        if not table[dtype]:
            has = [k for k, v in table.items() if v]
            raise ConfigError(f"{self.name} ({self.key}) has no {dtype} tensor cores (catalog peak 0); "
                              f"train in {self.half_dtype} (its peaks: {', '.join(f'{k} {table[k]:g}' for k in has)} "
                              "TFLOP/s)")
        return table[dtype]

    @property
    def half_dtype(self) -> str:
        """The 16-bit precision mixed-precision training uses here: bf16, or fp16 (with loss scaling)
        on parts without BF16 tensor cores (V100)."""
        return "bf16" if self.bf16_tflops else "fp16"

    @property
    def half_tflops(self) -> float:
        """Dense peak of :attr:`half_dtype`: what the planner, the MFU of a 16-bit run and the
        constant-efficiency baseline count against."""
        return self.peak_tflops(self.half_dtype)

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * 2**30

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["aliases"] = list(self.aliases)
        return d


_BUILTIN = [
    GPUSpec("a100-40gb", "NVIDIA A100-SXM4-40GB", 312, 312, 156, 19.5, 40.0, 1.555, 600, 25, 8, 108, 0.88,
            note="DGX A100, HDR 200 Gb/s per GPU"),
    GPUSpec("a100-80gb", "NVIDIA A100-SXM4-80GB", 312, 312, 156, 19.5, 80.0, 2.039, 600, 25, 8, 108, 0.88,
            note="DGX A100, HDR 200 Gb/s per GPU"),
    GPUSpec("h100-sxm", "NVIDIA H100 80GB HBM3", 989, 989, 494, 67, 79.6, 3.35, 900, 50, 8, 132, 0.79,
            note="DGX H100, NDR 400 Gb/s per GPU", fp8_tflops=1979, mma_sync_fraction=2 / 3),
    GPUSpec("h100-pcie", "NVIDIA H100 PCIe", 756, 756, 378, 51, 79.6, 2.0, 128, 25, 8, 114, 0.79,
            fabric="PCIe", note="no NVLink assumed: PCIe Gen5 x16 (128 GB/s both directions); one 200 Gb/s NIC per GPU",
            fp8_tflops=1513, mma_sync_fraction=2 / 3),
    GPUSpec("h200", "NVIDIA H200", 989, 989, 494, 67, 140.4, 4.8, 900, 50, 8, 132, 0.79,
            note="HGX H200 SXM 141 GB, NDR 400 Gb/s per GPU", fp8_tflops=1979, mma_sync_fraction=2 / 3),
    # Other generations and variants. Datasheet figures (dense, never sparse); gemm_fraction where no
    # GEMM was measured stays the 0.80 default, and each note says what the interconnect assumes.
    GPUSpec("v100-16gb", "Tesla V100-SXM2-16GB", 0, 125, 0, 15.7, 15.8, 0.9, 300, 6.25, 8, 80,
            note="DGX-1 (V100 datasheet): no BF16 or TF32 tensor cores, FP16 with loss scaling; NVLink2 hybrid "
                 "cube-mesh (6 links, 300 GB/s); 4 EDR 100 Gb/s NICs per 8 GPUs; gemm_fraction not measured"),
    GPUSpec("v100-32gb", "Tesla V100-SXM2-32GB", 0, 125, 0, 15.7, 31.7, 0.9, 300, 6.25, 8, 80,
            aliases=("Tesla V100-SXM3-32GB", "Tesla V100-SXM2-32GB-LS"),
            note="DGX-1 / DGX-2 (V100 datasheet): no BF16 or TF32 tensor cores, FP16 with loss scaling; NVLink2 "
                 "300 GB/s; 100 Gb/s EDR per 2 GPUs; a DGX-2's 16-GPU NVSwitch node: --catalog with "
                 "gpus_per_node: 16; gemm_fraction not measured"),
    GPUSpec("v100-pcie-16gb", "Tesla V100-PCIE-16GB", 0, 112, 0, 14.0, 15.8, 0.9, 32, 6.25, 8, 80,
            fabric="PCIe", note="V100 PCIe (datasheet): FP16 only; no NVLink: PCIe Gen3 x16 (32 GB/s both directions)"),
    GPUSpec("v100-pcie-32gb", "Tesla V100-PCIE-32GB", 0, 112, 0, 14.0, 31.7, 0.9, 32, 6.25, 8, 80,
            fabric="PCIe", note="V100 PCIe (datasheet): FP16 only; no NVLink: PCIe Gen3 x16 (32 GB/s both directions)"),
    GPUSpec("a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", 312, 312, 156, 19.5, 40.0, 1.555, 64, 25, 8, 108, 0.88,
            fabric="PCIe", note="A100 PCIe: no NVLink assumed (PCIe Gen4 x16, 64 GB/s both directions; a 2-GPU "
                                "NVLink bridge is 600 GB/s: --catalog)"),
    GPUSpec("a100-pcie-80gb", "NVIDIA A100 80GB PCIe", 312, 312, 156, 19.5, 80.0, 1.935, 64, 25, 8, 108, 0.88,
            fabric="PCIe", note="A100 80GB PCIe: no NVLink assumed (PCIe Gen4 x16, 64 GB/s both directions)"),
    GPUSpec("a800-80gb", "NVIDIA A800-SXM4-80GB", 312, 312, 156, 19.5, 80.0, 2.039, 400, 25, 8, 108, 0.88,
            note="A800 SXM: an A100 80GB with NVLink cut to 400 GB/s"),
    GPUSpec("h800", "NVIDIA H800", 989, 989, 494, 67, 79.6, 3.35, 400, 50, 8, 132, 0.79,
            aliases=("NVIDIA H800 80GB HBM3",),
            note="H800 SXM: an H100 SXM with NVLink cut to 400 GB/s (DeepSeek-V3 measured ~160 GB/s per "
                 "direction); 400 Gb/s InfiniBand per GPU", fp8_tflops=1979, mma_sync_fraction=2 / 3),
    GPUSpec("b200", "NVIDIA B200", 2250, 2250, 1100, 75, 179.0, 8.0, 1800, 50, 8, 148,
            note="HGX B200 (datasheet, approximate: dense BF16 2.25 PF, FP8 4.5 PF, 180 GB HBM3e (179 GiB) at "
                 "8 TB/s, NVLink5 1.8 TB/s); 400 Gb/s per GPU; gemm_fraction not measured", fp8_tflops=4500),
    GPUSpec("l40s", "NVIDIA L40S", 362, 362, 183, 91.6, 45.0, 0.864, 64, 25, 8, 142,
            fabric="PCIe", note="L40S (datasheet): 48 GB GDDR6 (45 GiB as the driver reports it), 864 GB/s; "
                                "no NVLink: PCIe Gen4 x16", fp8_tflops=733),
    GPUSpec("l4", "NVIDIA L4", 121, 121, 60, 30.3, 22.5, 0.3, 64, 12.5, 8, 58,
            fabric="PCIe", note="L4 (datasheet): 24 GB GDDR6, 300 GB/s; no NVLink: PCIe Gen4 x16", fp8_tflops=242),
    GPUSpec("mi250x", "AMD Instinct MI250X", 191.5, 191.5, 0, 23.95, 64.0, 1.6384, 200, 12.5, 8, 110,
            aliases=("AMD Instinct MI250X/MI250",),
            fabric="Infinity Fabric",
            note="one GCD (what PyTorch sees as a device: half an MI250X module, datasheet halved: 383 BF16 / "
                 "47.9 FP32 vector TFLOP/s and 3.28 TB/s per module; no TF32); Frontier-like node of 8 GCDs over "
                 "Infinity Fabric (50-200 GB/s between pairs, 200 assumed), Slingshot 25 GB/s per module; ROCm "
                 "(whose name 'MI250X/MI250' also covers the MI250, 362 TFLOP/s per module)"),
    GPUSpec("mi300x", "AMD Instinct MI300X", 1307, 1307, 653.7, 163.4, 191.5, 5.3, 896, 50, 8, 304,
            fabric="Infinity Fabric",
            note="MI300X (datasheet): 192 GB HBM3, 5.3 TB/s; Infinity Fabric 896 GB/s aggregate to 7 peers; "
                 "400 Gb/s per GPU; ROCm; gemm_fraction not measured", fp8_tflops=2615),
    GPUSpec("cpu", "CPU (generic server socket)", 2.0, 1.0, 1.0, 1.0, 256.0, 0.2, 100, 12.5, 1, 0, 0.8,
            fabric="shared memory", note="nominal figures for a 2-socket AVX-512 server; calibrate with --calibrate or a --catalog file"),
]

CATALOG: dict[str, GPUSpec] = {g.key: g for g in _BUILTIN}


def _norm(text: str) -> str:
    return re.sub(r"[\s_]+", " ", text.strip().lower())


def _pattern_match(name: str, catalog: dict[str, GPUSpec]) -> GPUSpec | None:
    """Map an NVML/torch device name to a built-in entry by its family and memory."""
    n = _norm(name)
    if "gh200" in n:
        return None  # different part (Grace Hopper); add it with --catalog
    if "h200" in n:
        return catalog.get("h200")
    if "h100" in n:
        if "nvl" in n:
            return None  # H100 NVL has its own peaks; not in the catalog
        return catalog.get("h100-pcie" if "pcie" in n else "h100-sxm")
    big = "80gb" in n.replace(" ", "")
    if "a100" in n:
        if "pcie" in n:
            return catalog.get("a100-pcie-80gb" if big else "a100-pcie-40gb")
        return catalog.get("a100-80gb" if big else "a100-40gb")
    if "a800" in n:
        return catalog.get("a800-80gb") if "pcie" not in n else None
    if "h800" in n:
        return catalog.get("h800") if "pcie" not in n else None
    if "v100" in n:
        size = "32gb" if "32gb" in n.replace(" ", "") else "16gb"
        return catalog.get(f"v100-pcie-{size}" if "pcie" in n else f"v100-{size}")
    if "mi250x" in n:
        return catalog.get("mi250x")
    if "mi300x" in n:
        return catalog.get("mi300x")
    if re.search(r"\bb200\b", n) and "gb200" not in n:
        return catalog.get("b200")
    if re.search(r"\bl40s\b", n):
        return catalog.get("l40s")
    if re.search(r"\bl4\b", n):
        return catalog.get("l4")
    if n in ("cpu",):
        return catalog.get("cpu")
    return None


def lookup_gpu(name_or_nvml_name: str, catalog: dict[str, GPUSpec] | None = None) -> GPUSpec | None:
    """The entry for a catalog key, an alias or an NVML name; ``None`` when unknown.

    >>> lookup_gpu("NVIDIA A100-SXM4-80GB").key
    'a100-80gb'
    """
    if not name_or_nvml_name:
        return None
    catalog = CATALOG if catalog is None else catalog
    n = _norm(name_or_nvml_name)
    for spec in catalog.values():
        if n == _norm(spec.key) or n == _norm(spec.name) or any(n == _norm(a) for a in spec.aliases):
            return spec
    return _pattern_match(name_or_nvml_name, catalog)


def get_gpu(name: str, catalog: dict[str, GPUSpec] | None = None) -> GPUSpec:
    """Like :func:`lookup_gpu` but raises a :class:`UserError` listing the catalog."""
    catalog = CATALOG if catalog is None else catalog
    spec = lookup_gpu(name, catalog)
    if spec is None:
        import difflib

        close = difflib.get_close_matches(name.lower(), list(catalog), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        listing = ", ".join(f"{k} ({v.name})" for k, v in catalog.items())
        raise UserError(
            f"GPU {name!r} is not in the hardware catalog.{hint} Known: {listing}. "
            "Add your device with --catalog FILE (YAML, see trainperf/hardware/catalog.py)."
        )
    return spec


_NUMERIC = {f.name for f in fields(GPUSpec)} - {"key", "name", "aliases", "note", "fabric"}
_ALLOWED = _NUMERIC | {"name", "aliases", "note", "fabric", "base"}


def load_catalog(path: str | None, base: dict[str, GPUSpec] | None = None) -> dict[str, GPUSpec]:
    """The built-in catalog extended (or overridden) by a user's YAML file."""
    catalog = dict(CATALOG if base is None else base)
    if not path:
        return catalog
    data = read_yaml_mapping(path, "catalog file", "a top-level 'gpus:' mapping")
    gpus = data.get("gpus")
    if not isinstance(gpus, dict):
        raise UserError(f"catalog file {path!r}: expected a top-level mapping 'gpus: {{key: {{field: value}}}}'")
    for key, entry in gpus.items():
        catalog[str(key)] = _entry_from_yaml(str(key), entry, catalog, path)
    return catalog


def read_yaml_mapping(path: str, what: str, expected: str) -> dict:
    """A YAML file's top-level mapping; any garbage (missing, a directory, binary, not UTF-8, empty,
    truncated, not a mapping) is a UserError naming the file and what was expected."""
    import yaml

    from trainperf.runio import read_text

    text = read_text(path, f"{what} (a YAML file with {expected})", max_bytes=16 * 2**20)
    from trainperf.runio import load_yaml

    try:
        data = load_yaml(text, f"{what} {path!r}")
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {path!r} is not valid YAML (truncated or corrupt?): {str(exc)[:300]}") from None
    except (ValueError, TypeError, RecursionError, OverflowError) as exc:
        raise UserError(f"{what} {path!r} cannot be parsed: {type(exc).__name__}: {str(exc)[:200]}") from None
    if data is None:
        raise UserError(f"{what} {path!r} is empty; it needs {expected}")
    if not isinstance(data, dict):
        raise UserError(f"{what} {path!r}: expected {expected}, found a {type(data).__name__}")
    return data


def _entry_from_yaml(key: str, entry, catalog: dict[str, GPUSpec], path: str) -> GPUSpec:
    if not isinstance(entry, dict):
        raise UserError(f"catalog file {path!r}: gpus.{key} must be a mapping of fields")
    unknown = {str(k) for k in entry} - _ALLOWED
    if unknown:
        raise UserError(
            f"catalog file {path!r}: gpus.{key} has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
            f"valid fields: {', '.join(sorted(_ALLOWED))}"
        )
    base_key = entry.get("base", key if key in catalog else None)
    if base_key is not None and (not isinstance(base_key, str) or base_key not in catalog):
        raise UserError(f"catalog file {path!r}: gpus.{key}.base={base_key!r} is not a catalog key; known: {', '.join(catalog)}")
    values: dict = {}
    for name in _NUMERIC:
        if name in entry:
            val = entry[name]
            if isinstance(val, str):
                try:
                    as_number = float(val)
                except ValueError:
                    as_number = None
                if as_number is not None and math.isfinite(as_number):
                    hint = str(int(as_number)) if as_number.is_integer() and abs(as_number) < 1e15 else repr(as_number)
                    raise UserError(f"catalog file {path!r}: gpus.{key}.{name}={val!r} is text to YAML (an exponent "
                                    f"without a decimal point, like 1e3, is not a number in YAML 1.1); write it as {hint}")
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not (0 <= val < float("inf")):
                raise UserError(f"catalog file {path!r}: gpus.{key}.{name}={val!r} must be a non-negative number")
            if name in ("gemm_fraction", "mma_sync_fraction") and not 0 < val <= 1:
                raise UserError(f"catalog file {path!r}: gpus.{key}.{name}={val!r} must be in (0, 1]")
            if name in ("gpus_per_node", "sms") and (val != int(val) or (name == "gpus_per_node" and val < 1)):
                raise UserError(f"catalog file {path!r}: gpus.{key}.{name}={val!r} must be a whole number"
                                + (" >= 1" if name == "gpus_per_node" else ""))
            values[name] = int(val) if name in ("gpus_per_node", "sms") else float(val)
    if "aliases" in entry:
        aliases = entry["aliases"]
        if isinstance(aliases, str):
            aliases = [aliases]
        if not isinstance(aliases, list) or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                    for a in aliases):
            raise UserError(f"catalog file {path!r}: gpus.{key}.aliases={entry['aliases']!r} must be a name or a list of "
                            "names (what NVML reports, e.g. [\"NVIDIA H100 80GB HBM3\"])")
        values["aliases"] = tuple(str(a) for a in aliases)
    for name in ("name", "note", "fabric"):
        if name in entry:
            values[name] = str(entry[name])
    if base_key is not None:
        return _usable(replace(catalog[base_key], key=key, **values), path)
    missing = sorted(_NUMERIC - {"sms", "gemm_fraction", "fp8_tflops", "mma_sync_fraction"} - set(values))
    if missing:
        raise UserError(
            f"catalog file {path!r}: new entry gpus.{key} lacks {', '.join(missing)}; give them or set 'base:' to an existing key"
        )
    values.setdefault("name", key)
    return _usable(GPUSpec(key=key, **values), path)


_POSITIVE = {"hbm_gib": "device memory, GiB", "hbm_tbps": "memory bandwidth, TB/s",
             "nvlink_gbps": "bandwidth between the GPUs of a node, GB/s", "internode_gbps": "network per GPU, GB/s",
             "fp32_tflops": "FP32 peak, TFLOP/s"}


_PLAUSIBLE = {"bf16_tflops": (0.1, 1e5), "fp16_tflops": (0.1, 1e5), "tf32_tflops": (0.01, 1e5),
              "fp32_tflops": (0.01, 1e5), "fp8_tflops": (0.1, 1e5), "hbm_gib": (0.1, 1e5), "hbm_tbps": (0.01, 1e3),
              "nvlink_gbps": (0.1, 1e5), "internode_gbps": (0.01, 1e5), "gpus_per_node": (1, 4096),
              "sms": (1, 1e5), "gemm_fraction": (0.05, 1.0), "mma_sync_fraction": (0.05, 1.0)}
"""What any accelerator's entry can hold (a value of 0 means "none" where the field allows it): outside it a
typo or a wrong unit (GB/s written as TB/s, bytes as GiB), and the planner's times would be nonsense."""


def _usable(spec: GPUSpec, path: str) -> GPUSpec:
    """An entry the planner can time: every rate it divides by above 0, each value in a plausible range, and a
    16-bit peak."""
    for name, what in _POSITIVE.items():
        if getattr(spec, name) <= 0:
            raise UserError(f"catalog file {path!r}: gpus.{spec.key}.{name}={getattr(spec, name)!r} must be > 0 ({what})")
    for name, (lo, hi) in _PLAUSIBLE.items():
        v = getattr(spec, name, None)
        if v is None or (v == 0 and name not in _POSITIVE and name != "gpus_per_node"):
            continue
        if not lo <= v <= hi:
            raise UserError(f"catalog file {path!r}: gpus.{spec.key}.{name}={v!r} is outside {lo:g}-{hi:g}, what any "
                            f"accelerator has ({_POSITIVE.get(name, name.replace('_', ' '))}); check its unit")
    if not (spec.bf16_tflops or spec.fp16_tflops):
        raise UserError(f"catalog file {path!r}: gpus.{spec.key} needs a 16-bit tensor peak: bf16_tflops or fp16_tflops "
                        "> 0 (fp16 alone for a part without BF16, like a V100)")
    return spec


__all__ = ["GPUSpec", "CATALOG", "lookup_gpu", "get_gpu", "load_catalog", "read_yaml_mapping"]
