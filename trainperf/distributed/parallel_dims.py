"""ParallelDims: the one owner of the parallel degrees, their checks and the DeviceMesh.

Degrees (config names in brackets)::

    pp  (parallelism.pipeline)    pipeline stages
    dp_replicate (parallelism.data)   data-parallel replicas (DDP, or FSDP2's replicate dim)
    dp_shard (parallelism.data_shard) FSDP2 sharding degree
    tp  (parallelism.tensor)      tensor-parallel degree (DTensor)

``pp x dp_replicate x dp_shard x tp`` must equal the world size; ``-1`` for
``data`` derives it. The mesh is laid out in that order (tp innermost, so a
tensor-parallel group is made of neighbouring ranks, i.e. the same node), and
built once: ``dims.mesh("tp")``, ``dims.mesh("dp")`` (replicate x shard,
flattened), ``dims.mesh("dp_shard")`` ... Everyone else asks this object.

Validation messages state the value, the constraint and the fix. Validation
needs no process group, so ``trainperf`` can reject a bad layout before any
work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainperf.errors import ConfigError


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fmt(ds: list[int]) -> str:
    return ", ".join(str(d) for d in ds[:-1]) + (" or " if len(ds) > 1 else "") + str(ds[-1])


@dataclass
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    world_size: int
    _mesh: Any = field(default=None, repr=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def single(cls) -> "ParallelDims":
        """One process: every degree 1."""
        return cls(dp_replicate=1, dp_shard=1, tp=1, pp=1, world_size=1)

    @classmethod
    def from_config(cls, cfg, world_size: int) -> "ParallelDims":
        """Degrees from ``cfg.parallelism`` (``data=-1`` derived), validated against the world size."""
        p = cfg.parallelism
        for name, val in (("data_shard", p.data_shard), ("tensor", p.tensor), ("pipeline", p.pipeline)):
            if val < 1:
                raise ConfigError(f"parallelism.{name}={val} must be a positive degree")
        others = p.tensor * p.pipeline * p.data_shard
        if p.data == -1:
            if world_size % others:
                raise ConfigError(
                    f"world size {world_size} is not divisible by parallelism.tensor x pipeline x data_shard = "
                    f"{p.tensor} x {p.pipeline} x {p.data_shard} = {others}; choose degrees whose product divides "
                    f"{world_size} (e.g. {_fmt(_divisors(world_size))}) or launch a multiple of {others} processes"
                )
            data = world_size // others
        else:
            data = p.data
        dims = cls(dp_replicate=data, dp_shard=p.data_shard, tp=p.tensor, pp=p.pipeline, world_size=world_size)
        dims.validate()
        return dims

    def validate(self) -> None:
        prod = self.dp_replicate * self.dp_shard * self.tp * self.pp
        if prod != self.world_size:
            raise ConfigError(
                f"parallelism.data x data_shard x tensor x pipeline = {self.dp_replicate} x {self.dp_shard} x "
                f"{self.tp} x {self.pp} = {prod}, but the world size is {self.world_size}; launch {prod} processes "
                f"(torchrun --nproc-per-node {prod}) or set parallelism.data=-1 to derive it from the world size"
            )

    # ------------------------------------------------------------------ properties
    @property
    def dp(self) -> int:
        """All data-parallel ranks: the global batch is split this many ways."""
        return self.dp_replicate * self.dp_shard

    @property
    def dp_enabled(self) -> bool:
        return self.dp > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        return (f"world {self.world_size} = pipeline {self.pp} x data {self.dp_replicate} x "
                f"data_shard {self.dp_shard} x tensor {self.tp}")

    # ------------------------------------------------------------------ coordinates (no mesh needed)
    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along each dimension (mesh order pp, dp_replicate, dp_shard, tp)."""
        tp_i = rank % self.tp
        r = rank // self.tp
        ds_i = r % self.dp_shard
        r //= self.dp_shard
        dr_i = r % self.dp_replicate
        pp_i = r // self.dp_replicate
        return {"pp": pp_i, "dp_replicate": dr_i, "dp_shard": ds_i, "tp": tp_i,
                "dp": dr_i * self.dp_shard + ds_i}

    def dp_rank(self, rank: int) -> int:
        """Which slice of the global batch this rank reads."""
        return self.coords(rank)["dp"]

    # ------------------------------------------------------------------ mesh
    def build_mesh(self, device_type: str):
        """Build the DeviceMesh once (all ranks must call this together)."""
        if self._mesh is not None:
            return self._mesh
        from torch.distributed.device_mesh import init_device_mesh

        names, shape = [], []
        for name, deg in (("pp", self.pp), ("dp_replicate", self.dp_replicate),
                          ("dp_shard", self.dp_shard), ("tp", self.tp)):
            if deg > 1:
                names.append(name)
                shape.append(deg)
        if not names:  # one process: a trivial 1-D mesh so callers need no special case
            names, shape = ["dp"], [1]
        mesh = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))
        if self.dp_replicate > 1 and self.dp_shard > 1:
            mesh["dp_replicate", "dp_shard"]._flatten("dp")
        self._mesh = mesh
        return mesh

    def mesh(self, name: str):
        """A sub-mesh by name: pp, dp_replicate, dp_shard, tp, dp (all data ranks), or the root ("world")."""
        if self._mesh is None:
            raise RuntimeError("ParallelDims.build_mesh(device_type) must be called first")
        if name == "world":
            return self._mesh
        if name == "dp":
            if self.dp_replicate > 1 and self.dp_shard > 1:
                return self._mesh["dp"]
            if self.dp_replicate > 1:
                return self._mesh["dp_replicate"]
            if self.dp_shard > 1:
                return self._mesh["dp_shard"]
            if "dp" in (self._mesh.mesh_dim_names or ()):
                return self._mesh["dp"]
            return None
        if name not in (self._mesh.mesh_dim_names or ()):
            return None
        return self._mesh[name]

    def fsdp_mesh(self):
        """Mesh for FSDP2: 1-D dp_shard, or 2-D (dp_replicate, dp_shard) = HSDP. With tensor or pipeline
        parallelism and only replicas, FSDP2's replicate dim is used (dp_shard of size 1 in a 2-D mesh)."""
        if self.dp_replicate > 1 and self.dp_shard > 1:
            return self._mesh["dp_replicate", "dp_shard"]
        if self.dp_shard > 1:
            return self._mesh["dp_shard"]
        if self.dp_replicate > 1:
            return self._mesh["dp_replicate"]
        return None


def check_compression(compression: str, *, dp_replicate: int, dp_shard: int, tp: int, pp: int = 1) -> None:
    """Reject a compression hook this layout cannot run (before any work starts)."""
    if compression == "none":
        return
    if dp_shard > 1:
        raise ConfigError(
            f"parallelism.compression.type={compression!r} is a DDP communication hook, but data_shard={dp_shard} "
            "uses FSDP2, which has no hooks; use parallelism.fsdp_reduce_dtype=bf16 instead, or data_shard=1"
        )
    if dp_replicate <= 1:
        raise ConfigError(
            f"parallelism.compression.type={compression!r} compresses data-parallel gradients, but parallelism.data=1: "
            "nothing is all-reduced; set compression.type=none or data > 1"
        )
    if tp > 1 or pp > 1:
        which = f"tensor={tp}" if tp > 1 else f"pipeline={pp}"
        raise ConfigError(
            f"parallelism.compression.type={compression!r} with {which}: data replicas of a tensor- or pipeline-parallel "
            "model use FSDP2's replicate, which has no DDP communication hooks; set compression.type=none "
            "(or fsdp_reduce_dtype=bf16 with data_shard), or use data parallelism alone"
        )
