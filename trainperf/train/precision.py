"""Precision policy: explicit, not a side effect of environment variables.

fp32: fp32 everywhere, TF32 explicitly off. tf32: fp32 storage with TF32 matmuls
and convolutions (Ampere+). bf16 / fp16: autocast; fp16 adds a GradScaler.
(NVIDIA_TF32_OVERRIDE=0 only disables TF32; it never selects fp16.)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass
class Precision:
    dtype: str
    device_type: str
    scaler: torch.amp.GradScaler | None = None

    def autocast(self):
        if self.dtype == "bf16":
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        if self.dtype == "fp16":
            return torch.autocast(self.device_type, dtype=torch.float16)
        return contextlib.nullcontext()


def set_tf32(enabled: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def build_precision(dtype: str, device_type: str, init_scale: float = 2.0**16) -> Precision:
    if device_type == "cuda":
        set_tf32(dtype == "tf32")
    scaler = torch.amp.GradScaler(device_type, init_scale=init_scale) if dtype == "fp16" else None
    return Precision(dtype=dtype, device_type=device_type, scaler=scaler)
