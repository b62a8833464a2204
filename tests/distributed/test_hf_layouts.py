"""A Hugging Face Llama (tiny: 2 layers, hidden 32, 4 heads / 2 KV heads, SwiGLU, SDPA) trains through the
same Trainer and parallelize path as the reference GPT: FSDP2 x TP=2 with sequence parallelism and
DDP x TP=2 on 4 gloo processes match one process (loss 1e-5 relative per step, parameters 1e-4
absolute, the clipped gradient norm 1e-5 relative: test_layouts.py's bounds)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers", reason="transformers not installed (pip install -e .[integrations])")

import dist_cases  # noqa: E402
from test_layouts import _check  # noqa: E402
from trainperf.distributed.spawn import spawn  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def four():
    os.environ["OMP_NUM_THREADS"] = "1"
    return spawn(dist_cases.hf_four_process, 4, timeout_s=dist_cases.COLLECTIVE_TIMEOUT_S)


@pytest.mark.parametrize("case", list(dist_cases.HF_FOUR))
def test_hf_llama_layout_matches_one_process(four, case):
    _check(four[case])
    assert "per block at 'model.layers'" in four[case]["notes"].get("wrapping", "") or case == "hf_data2_tp2"
