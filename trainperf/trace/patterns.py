"""THE table that says what a GPU kernel is, by its name: compute, communication or memory; on tensor cores
or not; an fp32 GEMM/convolution a tensor core could have run; a warp-specialized tensor-core kernel (one
large block per SM by design, so its low "achieved occupancy" is no fault).

Every figure of :mod:`trainperf.trace` classifies kernels here and nowhere else. Names are matched with
``re.search`` (case-insensitive) against the kernel's full name as the trace records it.

**Communication** is more than NCCL: RCCL, NVSHMEM, expert-parallel all-to-all (DeepEP's
``deep_ep::intranode::dispatch`` / ``combine`` / ``notify_dispatch``, pplx-kernels, UCCL), MSCCL++,
torch symmetric-memory and custom all-reduce kernels (``one_shot_all_reduce``, ``cross_device_reduce``),
oneCCL and HCCL. HTA counts only ``^nccl.*Kernel``, so it calls an MoE's all-to-all computation.

**Memory**: ``Memcpy ...`` / ``Memset ...`` / ``dma...`` names (and every ``gpu_memcpy`` / ``gpu_memset``
event, whatever its name).

**Tensor cores**: the TensorBoard plugin's Volta/Ampere list (``TB_TENSOR_CORE``, kept verbatim so its
figure can be reproduced), plus what came after: Hopper ``wgmma`` / ``gmma`` / ``sm90`` cuBLASLt and CUTLASS
3.x kernels, ``nvjet`` (cuBLAS 12.x), Blackwell ``sm100`` / ``sm120`` / ``tcgen05``, FP8 / FP4 GEMMs
(``fp8``, ``e4m3``, ``e5m2``, ``f8f6f4``, ``nvfp4``, ``mxfp8``, ``tf32``: only in a name that is also a GEMM,
convolution or attention, since casts and scales are named by their dtype too), FlashAttention 2 and 3 (``flash::``,
``flash_fwd``, ``FlashAttnFwdSm90``), cuDNN / CUTLASS fused attention in half precision, CUTLASS
``tensorop`` kernels, and AMD matrix cores (``mfma``, Tensile ``_MI16x16x16``, Composable Kernel ``xdl``).
A GEMM named by its ``ffma`` math (cuBLAS's ``sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...``) runs on CUDA
cores: it is an fp32 GEMM, whatever its ``xmma`` family says.

**Host calls and phases** (:func:`host_kind`): runtime calls that allocate (``cudaMalloc``/``cudaFree`` and
their HIP and driver twins), synchronize or launch, and the CPU events that mark the DataLoader, the optimizer
step and Python's garbage collector: what GPU idle time is charged to.

Users extend the table (``--comm-pattern REGEX`` on the CLI, or a YAML/JSON file): see :func:`load`.
A user's pattern is tried before the built-in ones of its class, and a user's ``compute`` pattern wins over
the built-in communication/memory ones (to take back a name the table gets wrong).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from trainperf.errors import UserError

COMPUTE, COMMUNICATION, MEMORY = "compute", "communication", "memory"
KINDS = (COMPUTE, COMMUNICATION, MEMORY)

# ---------------------------------------------------------------------------- the built-in table
COMMUNICATION_PATTERNS = [
    r"nccl", r"rccl", r"nvshmem", r"deep_?ep", r"pplx", r"uccl", r"mscclpp", r"msccl", r"oneccl", r"\bhccl",
    r"all_?to_?all", r"all_?gather", r"reduce_?scatter", r"all_?reduce", r"cross_device_reduce",
    r"one_shot_|two_shot_", r"multimem_", r"symm_?mem", r"sendrecv|send_recv", r"\bnvls",
    # DeepEP-style expert-parallel kernels: functions named dispatch / combine / notify_*, in their own
    # namespace (deep_ep::intranode::dispatch<...>, internode_ll::combine(...)) or as *_dispatch_kernel
    r"(?:^|::|\s)(?:notify_)?(?:dispatch|combine)\s*[<(]", r"::(?:intranode|internode|internode_ll|low_latency)::",
    r"(?:^|_)(?:a2a|ep)_(?:dispatch|combine)", r"(?:dispatch|combine)_(?:send|recv)",
]
MEMORY_PATTERNS = [r"^memcpy", r"^memset", r"^dma"]

# The TensorBoard plugin 0.4.3's list (tensor_core.py: a substring match), verbatim.
TB_TENSOR_CORE = ["h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "dgrad_1x1_stride_2x2",
                  "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group", "xmma_implicit_gemm",
                  "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm",
                  "c1688"]
TENSOR_CORE_PATTERNS = [re.escape(s) for s in TB_TENSOR_CORE] + [
    r"i16832|16832|h16816|i8832", r"xmma", r"tensorop", r"wmma", r"\bmma_", r"_mma\b", r"gmma",  # wgmma, hgmma
    r"sm9\d_|sm9\da|sm_9\d", r"sm1[0-2]\d_|sm1[0-2]\da|sm_1[0-2]\d", r"cutlass3x",
    r"tcgen05|utcmma|umma",
    r"KernelTma\w*WarpSpecialized|MainloopSm\d+",  # CUTLASS 3.x Hopper+ GEMM schedules (GMMA / UMMA)
    r"nvjet",
    r"flash::|flash_fwd|flash_bwd|flashattn|flash_attn|fmha_.*(?:bf16|f16|fp16)|fused_attn.*(?:bf16|f16|fp16)",
    r"cudnn_generated_fort_native_sdpa|sdpa_flash|fmha_v2|fmha_sm\d",
    # AMD matrix cores (MFMA): the instruction or Tensile's MI tile in the name, composable_kernel's *xdl*
    # kernels (and MIOpen's *xdlops* ones), MIOpen's xdlops implicit-GEMM convolutions (igemm_fwd_gtcx3_...,
    # igemm_wrw_gtcx_...: "gtc" without the x is the VALU variant), hipBLASLt / Tensile GEMMs (Cijk_...)
    r"mfma|_mi\d+x\d+x\d+|xdl", r"igemm_\w*gtcx", r"\bCijk_",
]
# Low-precision data types: a tensor-core kernel only when the name is also a GEMM / convolution / attention
# (GEMM_PATTERNS). FP8 training is full of memory-bound kernels named by their dtype: DeepSeek's H800 trace
# has per_token_cast_to_fp8 and cast_back_impl<__nv_fp8x2_e4m3>, torchao its amax / scale / cast kernels.
DTYPE_TENSOR_CORE_PATTERNS = [r"fp8|e4m3|e5m2|f8f8|f8f6f4|nvfp4|mxfp|fp4_|_fp4", r"tf32"]
# fp32 GEMM / convolution kernels on CUDA cores: a tensor core could run them (TF32 on Ampere+, bf16/fp16)
FP32_GEMM_PATTERNS = [r"sgemm", r"scudnn", r"_simt_|simt_sgemm", r"gemmsn_|gemmk1_kernel", r"winograd(?!.*(?:h|16))",
                      r"convolve_sgemm", r"implicit_gemm.*f32f32_f32f32", r"fft2d_r2c|fft2d_c2r"]
# kernels named by their FFMA math (fp32 fused multiply-add on CUDA cores) though their family is a tensor-core one:
# cuBLAS's sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_... (what an H100 or A100 runs for an fp32 matmul without
# TF32) is an fp32 GEMM, not a tensor-core kernel, whatever "xmma" says
CUDA_CORE_PATTERNS = [r"(?:^|_)ffma(?:_|$)"]
# GEMM / convolution kernels in general (the base of "which share of the GEMM time is low precision")
GEMM_PATTERNS = [r"gemm", r"conv(?!er)", r"cudnn", r"cutlass", r"xmma", r"nvjet", r"wgrad|dgrad|fprop", r"matmul",
                 r"flash", r"fmha", r"attn", r"Cijk_", r"triton_tem_fused_.*mm", r"scaled_?mm|_mm_kernel|\bmm_?kernel"]
WARP_SPECIALIZED_PATTERNS = [r"wgmma|gmma", r"warp_?specialized|warpspecialized", r"sm9\d_|sm9\da|sm1[0-2]\d_",
                             r"cutlass3x", r"nvjet", r"flashattn.*sm9|flash.*sm90|sm90.*flash", r"tma_|_tma",
                             r"persistent", r"tcgen05"]


# ---------------------------------------------------------------------------- host calls and phases
# What a host runtime call or CPU event is, for charging GPU idle time to it (trainperf.trace.attribution).
# CUDA runtime, CUDA driver and HIP spellings alike (hipFree counts as cudaFree). Matched with re.match on the
# whole name, case-sensitive (they are API names).
HOST_PATTERNS = {
    # device and pinned-host memory: the caching allocator's misses (cudaMalloc), empty_cache / no caching
    # (cudaFree, which synchronizes the device), pinned buffers, expandable segments' cuMemMap family
    "allocator": [r"(?:cuda|hip)(?:Malloc\w*|Free\w*|HostAlloc|HostMalloc|HostFree|HostRegister|HostUnregister|"
                  r"ExtMallocWithFlags|Mem(?:Create|Release|Map|Unmap|AddressReserve|AddressFree|SetAccess|"
                  r"PoolTrimTo))$",
                  r"cuMem(?:Alloc\w*|Free\w*|HostAlloc|HostRegister\w*|HostUnregister|Create|Release|Map|Unmap|"
                  r"AddressReserve|AddressFree|SetAccess)$"],
    # the host waits for the device: stream / device / event syncs, blocking (non-Async) copies
    "sync": [r"(?:cuda|hip)(?:Stream|Device|Event|Thread|Ctx)Synchronize$", r"cu(?:Stream|Ctx|Event)Synchronize$",
             r"(?:cuda|hip)Memcpy(?:2D|3D|Peer|ToSymbol|FromSymbol|DtoH|HtoD|DtoD|ToArray|FromArray|WithStream)?$",
             r"cuMemcpy(?:DtoH|HtoD|DtoD|Peer|2D|3D)?(?:_v2)?$"],
    # work put on a stream: kernels, graphs, async copies and fills
    "launch": [r"(?:cuda|hip)(?:LaunchKernel\w*|LaunchCooperativeKernel\w*|ExtLaunchKernel\w*|ModuleLaunchKernel|"
               r"ExtModuleLaunchKernel|HccModuleLaunchKernel|GraphLaunch|LaunchHostFunc|Memcpy\w*Async|"
               r"Memset\w*Async)$",
               r"cu(?:LaunchKernel\w*|LaunchCooperativeKernel\w*|GraphLaunch|Memcpy\w*Async\w*|"
               r"Memset\w*Async\w*)$", r"runFunction - job_prep_and_submit_for_execution$"],
    # Python's garbage collector (torch.profiler's record_python_gc_info), an explicit gc.collect
    "gc": [r"Python GC$", r"gc\.collect\b"],
    # the DataLoader's next batch (its annotation; its __next__ as a Python function with with_stack)
    "dataloader": [r"enumerate\(DataLoader\)#", r"enumerate\(DataPipe\)#",
                   r"\S*torch/utils/data/dataloader\.py\(\d+\): __next__$"],
    # the optimizer step and zero_grad (torch.optim's annotations; its functions with with_stack)
    "optimizer": [r"Optimizer\.(?:step|zero_grad)#", r"\S*torch/optim/\w+\.py\(\d+\): (?:step|zero_grad)$"],
    # the profiler's step annotation: it covers the whole step, so it says nothing about what the host did
    "step": [r"ProfilerStep\s*#\s*\d"],
}
HOST_KINDS = tuple(HOST_PATTERNS)
_HOST_RE = [(k, re.compile("|".join(f"(?:{p})" for p in v))) for k, v in HOST_PATTERNS.items()]


def host_kind(name: str) -> str:
    """What a host event is, by its name: one of :data:`HOST_KINDS` or ``"other"`` (a plain CPU op, Python
    function or annotation, or a runtime call that is none of these, such as ``cudaEventRecord``)."""
    n = str(name)
    for k, r in _HOST_RE:
        if r.match(n):
            return k
    return "other"


_INLINE_FLAGS = re.compile(r"\(\?[aiLmsux-]")  # (?i), (?L), (?-i:...): flags a lowered pattern could change
_CHAR_ESCAPE = re.compile(r"\\[xuUN0-7]")  # a letter written by its code (\x41, \N{...}) keeps its case


def _lowered(pattern: str) -> str | None:
    """``pattern`` with every ASCII letter that is not escaped made lower case, for matching a lower-cased name
    without ``re.IGNORECASE`` (3x faster on long kernel names: case-insensitive alternations cannot use the
    regex engine's literal scans); None where that could change its meaning (inline flags, a character written
    by its code, a non-ASCII letter)."""
    if not pattern.isascii() or _INLINE_FLAGS.search(pattern) or _CHAR_ESCAPE.search(pattern):
        return None
    out, escaped = [], False
    for ch in pattern:
        out.append(ch if escaped else ch.lower() if "A" <= ch <= "Z" else ch)
        escaped = ch == "\\" and not escaped
    return "".join(out)


class _Matcher:
    """A case-insensitive regex over kernel names: lowered and matched against the lower-cased name where
    :func:`_lowered` allows, else compiled with ``re.IGNORECASE`` and matched against the name."""

    __slots__ = ("rx", "lower")

    def __init__(self, pattern: str):
        low = _lowered(pattern)
        rx = None
        if low is not None:
            try:
                rx = re.compile(low)
            except re.error:
                rx = None
        self.lower = rx is not None
        self.rx = rx if rx is not None else re.compile(pattern, re.I)

    def search(self, name: str, low: str | None = None):
        if self.lower:
            return self.rx.search(low if low is not None else name.lower())
        return self.rx.search(name)

    @property
    def pattern(self) -> str:
        return self.rx.pattern


def _compile(pats: Iterable[str], what: str, user: Iterable[str] = ()) -> _Matcher | None:
    """The patterns as one case-insensitive matcher; a user's (``user``, among them) are each checked alone
    first, to name the one that is not valid (the built-in table is known good: compiled once, as one)."""
    for p in user:
        if not p:
            continue
        try:
            re.compile(p)
        except re.error as exc:
            raise UserError(f"the {what} pattern {p!r} is not a valid regular expression ({exc}); "
                            "fix it (Python re syntax, matched with re.search, case-insensitive)") from exc
    pats = [p for p in pats if p]
    if not pats:
        return None
    return _Matcher("|".join(f"(?:{p})" for p in pats))


@dataclass
class Patterns:
    """The pattern table, built-in plus a user's additions (each list: regexes, re.search, no case)."""
    communication: list[str] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)
    compute: list[str] = field(default_factory=list)
    tensor_core: list[str] = field(default_factory=list)
    fp32_gemm: list[str] = field(default_factory=list)
    warp_specialized: list[str] = field(default_factory=list)
    source: str = "built-in"

    def __post_init__(self):
        self._user_compute = _compile(self.compute, "compute", self.compute)
        self._comm = _compile(list(self.communication) + COMMUNICATION_PATTERNS, "communication", self.communication)
        self._mem = _compile(list(self.memory) + MEMORY_PATTERNS, "memory", self.memory)
        self._tc = _compile(list(self.tensor_core) + TENSOR_CORE_PATTERNS, "tensor_core", self.tensor_core)
        self._tc_dtype = _compile(DTYPE_TENSOR_CORE_PATTERNS, "tensor_core")
        self._fp32 = _compile(list(self.fp32_gemm) + FP32_GEMM_PATTERNS, "fp32_gemm", self.fp32_gemm)
        self._cuda_core = _compile(CUDA_CORE_PATTERNS, "fp32_gemm")
        self._gemm = _compile(GEMM_PATTERNS + list(self.tensor_core) + list(self.fp32_gemm), "gemm")
        self._ws = _compile(list(self.warp_specialized) + WARP_SPECIALIZED_PATTERNS, "warp_specialized",
                            self.warp_specialized)
        self._cache: dict[str, tuple] = {}

    def kind(self, name: str) -> str:
        """compute | communication | memory."""
        return self.describe(name)[0]

    def describe(self, name: str) -> tuple[str, bool, bool, bool, bool]:
        """(kind, tensor_core, fp32_gemm, gemm_or_conv, warp_specialized) of a kernel name; memoized."""
        got = self._cache.get(name)
        if got is not None:
            return got
        low = name.lower()
        if self._user_compute is not None and self._user_compute.search(name, low):
            kind = COMPUTE
        elif self._comm.search(name, low):
            kind = COMMUNICATION
        elif self._mem.search(name, low):
            kind = MEMORY
        else:
            kind = COMPUTE
        gemm_name = bool(self._gemm.search(name, low))
        ffma = gemm_name and bool(self._cuda_core.search(name, low))  # an xmma GEMM on CUDA cores: fp32, not TC
        tc = kind == COMPUTE and not ffma and (bool(self._tc.search(name, low)) or
                                               (gemm_name and bool(self._tc_dtype.search(name, low))))
        fp32 = kind == COMPUTE and not tc and (ffma or bool(self._fp32.search(name, low)))
        gemm = kind == COMPUTE and (tc or fp32 or gemm_name)
        ws = tc and bool(self._ws.search(name, low))
        got = (kind, tc, fp32, gemm, ws)
        self._cache[name] = got
        return got

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "communication": list(self.communication), "memory": list(self.memory),
                "compute": list(self.compute), "tensor_core": list(self.tensor_core),
                "fp32_gemm": list(self.fp32_gemm), "warp_specialized": list(self.warp_specialized)}


def tb_tensor_core(name: str) -> bool:
    """The TensorBoard plugin's own test (a substring of its list), for its figure."""
    return any(s in name for s in TB_TENSOR_CORE)


HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def hta_kind(name: str) -> str:
    """HTA 0.5.0's kernel type (hta/utils/utils.py get_kernel_type): COMMUNICATION, MEMORY, COMPUTATION or
    OTHER; for the side-by-side figures only."""
    if HTA_COMM_RE.match(name):
        return "communication"
    if HTA_MEMORY_RE.match(name):
        return "memory"
    if not HTA_NOT_COMPUTE_RE.match(name):
        return "compute"
    return "other"


_KEYS = {"communication", "memory", "compute", "tensor_core", "fp32_gemm", "warp_specialized"}


def _from_mapping(d: Any, where: str) -> Patterns:
    if not isinstance(d, dict):
        raise UserError(f"{where}: a pattern file holds a mapping of lists, e.g. "
                        "{communication: ['my_a2a_kernel'], tensor_core: ['my_tc_gemm']}")
    bad = sorted(set(map(str, d)) - _KEYS)
    if bad:
        raise UserError(f"{where}: unknown key(s) {bad}; the keys are {sorted(_KEYS)}")
    out: dict[str, list[str]] = {}
    for k, v in d.items():
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise UserError(f"{where}: {k} must be a list of regular expressions (strings)")
        out[k] = v
    return Patterns(**out, source=where)


def load(spec: Any = None) -> Patterns:
    """A :class:`Patterns` from what a caller has: None (the built-in table), a Patterns, a list of extra
    communication regexes (``--comm-pattern``), a mapping ``{communication: [...], memory: [...],
    compute: [...], tensor_core: [...], fp32_gemm: [...], warp_specialized: [...]}``, or the path of a
    YAML / JSON file holding that mapping."""
    if spec is None:
        return DEFAULT
    if isinstance(spec, Patterns):
        return spec
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(x, str) for x in spec):
            raise UserError(f"communication patterns must be strings (regular expressions), got {spec!r}")
        return Patterns(communication=list(spec), source="--comm-pattern") if spec else DEFAULT
    if isinstance(spec, dict):
        return _from_mapping(spec, "patterns")
    if isinstance(spec, (str, Path)):
        p = Path(spec)
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"pattern file {p}: cannot be read ({exc}); pass a YAML or JSON file") from exc
        try:
            if p.suffix.lower() == ".json":
                d = json.loads(text)
            else:
                from trainperf.runio import load_yaml

                d = load_yaml(text, f"pattern file {p}")
        except UserError:
            raise
        except Exception as exc:  # yaml.YAMLError, json.JSONDecodeError
            raise UserError(f"pattern file {p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'} "
                            f"({exc})") from exc
        return _from_mapping(d, str(p))
    raise UserError(f"patterns={spec!r}: pass a list of regexes, a mapping or a YAML/JSON file path")


DEFAULT = Patterns()


def classify_kernel(name: str, patterns: Any = None) -> str:
    """``"communication"`` | ``"compute"`` | ``"memory"`` for a kernel name, by the table (plus ``patterns``:
    anything :func:`load` takes)."""
    return load(patterns).kind(str(name))


def is_tensor_core(name: str, patterns: Any = None) -> bool:
    return load(patterns).describe(str(name))[1]


__all__ = ["COMMUNICATION_PATTERNS", "CUDA_CORE_PATTERNS", "DEFAULT", "FP32_GEMM_PATTERNS", "HOST_KINDS", "HOST_PATTERNS",
           "MEMORY_PATTERNS", "Patterns", "TB_TENSOR_CORE", "TENSOR_CORE_PATTERNS", "WARP_SPECIALIZED_PATTERNS",
           "classify_kernel", "host_kind", "hta_kind", "is_tensor_core", "load", "tb_tensor_core"]
