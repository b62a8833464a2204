"""The kernel-name matchers run the built-in case-insensitive table as lowered regexes over lower-cased names
(3x faster than re.IGNORECASE on long names): the same answer as re.IGNORECASE on every GPU name of the
committed real traces and on names written to trip it; patterns a lowering could change keep re.IGNORECASE."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from trainperf.trace import patterns as P
from trainperf.trace.analyze import read_timeline

ROOT = Path(__file__).resolve().parents[2]
TABLE = {"communication": P.COMMUNICATION_PATTERNS, "memory": P.MEMORY_PATTERNS, "tensor_core": P.TENSOR_CORE_PATTERNS,
         "dtype_tensor_core": P.DTYPE_TENSOR_CORE_PATTERNS, "fp32_gemm": P.FP32_GEMM_PATTERNS,
         "cuda_core": P.CUDA_CORE_PATTERNS, "gemm": P.GEMM_PATTERNS, "warp_specialized": P.WARP_SPECIALIZED_PATTERNS}
TRICKY = ["NCCLDEVKERNEL_ALLREDUCE_SUM_F32_RING_LL", "ncclKernel_AllGather_RING_LL_Sum_int8_t", "Memcpy HtoD (Pageable -> Device)",
          "MEMSET (DEVICE)", "sm90_xmma_gemm_F16F16_F16F32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
          "ampere_SGEMM_128x64_nn", "Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "void at::native::vectorized_elementwise_kernel<4>",
          "igemm_fwd_gtcx2_nhwc_fp16", "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 64, 4, false, false, cutlass::bfloat16_t>>",
          "", "K\u212aLVIN \u00c9t\u00e9 kernel", "nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"]


def real_names() -> list[str]:
    names: set[str] = set()
    for f in sorted((ROOT / "tests/data/real").rglob("*.json.gz"))[:40]:
        try:
            tl = read_timeline(f)
        except Exception:  # noqa: BLE001 - a file the reader refuses has no names to compare
            continue
        names.update(tl.names[i] for i in np.unique(tl.g_name).tolist())
    return sorted(names)


@pytest.fixture(scope="module")
def names():
    got = real_names()
    assert len(got) > 500  # the committed real traces' kernel, copy and fill names
    return got + TRICKY


@pytest.mark.parametrize("group", list(TABLE))
def test_lowered_matchers_answer_as_ignorecase_on_real_names(group, names):
    pattern = "|".join(f"(?:{p})" for p in TABLE[group])
    fast, ref = P._Matcher(pattern), re.compile(pattern, re.I)
    assert fast.lower  # the built-in table is lowered
    assert [bool(fast.search(n)) for n in names] == [bool(ref.search(n)) for n in names]
    assert [bool(fast.search(n, n.lower())) for n in names] == [bool(ref.search(n)) for n in names]


@pytest.mark.parametrize("pattern, name, hit", [
    (r"(?-i:Gemm)", "GEMM", False),  # an inline flag: not lowered, re.I as written
    (r"\x41BC", "abc", True),  # a letter by its code
    (r"\u00c9t\u00e9", "\u00e9t\u00e9", True),
    ("\u00c9T\u00c9", "\u00e9t\u00e9", True),  # a non-ASCII letter
    (r"\Bemm\b", "GEMM", True),  # escapes keep their case (\B stays a non-boundary)
    (r"[^A-Z]x", "AX", False),
])
def test_patterns_a_lowering_could_change_keep_ignorecase(pattern, name, hit):
    m = P._Matcher(pattern)
    assert bool(m.search(name)) is hit is bool(re.compile(pattern, re.I).search(name))


def test_user_patterns_and_describe_unchanged():
    pats = P.Patterns(communication=[r"MyAllReduce"], compute=[r"not_comm_NCCL"])
    assert pats.kind("myallreduce_kernel") == P.COMMUNICATION
    assert pats.kind("NOT_COMM_nccl_kernel") == P.COMPUTE
    assert pats.describe("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32")[1] is True
