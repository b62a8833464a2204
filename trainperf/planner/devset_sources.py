"""Published runs added to the planner's development set (issue 22), as data with citations.

Each table cites where its figures stand (paper table, or repository file and line at a named
commit) and says how the published figure became a step time. ``approx`` marks a figure that
is read off, derived from totals (GPU-hours), an "up to" figure, or whose layout the source
does not state. Nothing here is fitted: the rows only judge the model (leave-one-source-out).
"""

from __future__ import annotations

# --------------------------------------------------------------------------- BLOOM (Megatron-DeepSpeed)
BLOOM_CITE = ("bigscience-workshop/bigscience @ 9e64edec, train/tr11-176B-ml/chronicles-prequel.md "
              "(topology benchmarks, 48 x 8 A100 80GB on Jean Zay, iteration-2 'Sec/it'), README.md l.658-663 "
              "(production run, iteration 85376: 104.70 s/iteration) and tr11-176B-ml.slurm l.66-75 (TP 4, PP 12, "
              "MBS 2, GBS 2048, 70 layers, h 14336)")
BLOOM_NOTE = ("Megatron-DeepSpeed: eager attention with Megatron's fused softmax, fused bias-GeLU, full "
              "activation checkpointing, bf16 with DeepSpeed's ZeRO-1-equivalent optimizer sharding, gradients "
              "reduced after the pipeline's backward; ALiBi (no position table), vocabulary padded to 250,880, "
              "tied output, seq 2048; Omni-Path 4 x 100 Gb/s per node (6.25 GB/s per GPU)")
# (label, layers, hidden, heads, dp, tp, pp, micro-batch, global batch, s/iteration, source line)
BLOOM = [
    ("176B production", 70, 14336, 112, 8, 4, 12, 2, 2048, 104.70, "README.md:663"),
    ("181B TP8 PP6 DP8 mb4", 72, 14336, 64, 8, 8, 6, 4, 2048, 114.11, "chronicles-prequel.md:776"),
    ("181B TP8 PP6 DP8 mb6", 72, 14336, 64, 8, 8, 6, 6, 2016, 123.57, "chronicles-prequel.md:777"),
    ("181B TP8 PP12 DP4 mb4", 72, 14336, 64, 4, 8, 12, 4, 2048, 117.07, "chronicles-prequel.md:779"),
    ("181B TP8 PP12 DP4 mb2", 72, 14336, 64, 4, 8, 12, 2, 2048, 128.82, "chronicles-prequel.md:781"),
    ("181B TP8 PP8 DP6 mb4", 72, 14336, 64, 6, 8, 8, 4, 2016, 113.16, "chronicles-prequel.md:788"),
    ("181B TP8 PP4 DP12 mb2", 72, 14336, 64, 12, 8, 4, 2, 2016, 125.52, "chronicles-prequel.md:789"),
    ("181B TP8 PP4 DP12 mb4", 72, 14336, 64, 12, 8, 4, 4, 2016, 114.81, "chronicles-prequel.md:790"),
    ("181B TP8 PP2 DP24 mb1", 72, 14336, 64, 24, 8, 2, 1, 2016, 145.45, "chronicles-prequel.md:791"),
    ("181B TP8 PP2 DP24 mb2", 72, 14336, 64, 24, 8, 2, 2, 2016, 136.13, "chronicles-prequel.md:792"),
    ("181B TP4 PP12 DP8 mb4", 72, 14336, 64, 8, 4, 12, 4, 2048, 111.89, "chronicles-prequel.md:800"),
    ("181B TP4 PP12 DP8 mb2", 72, 14336, 64, 8, 4, 12, 2, 2048, 110.48, "chronicles-prequel.md:801"),
    ("181B TP4 PP6 DP16 mb4", 72, 14336, 64, 16, 4, 6, 4, 2048, 117.11, "chronicles-prequel.md:803"),
    ("181B TP4 PP6 DP16 mb2", 72, 14336, 64, 16, 4, 6, 2, 2048, 111.71, "chronicles-prequel.md:804"),
    ("181B TP2 PP12 DP16 mb2", 72, 14336, 64, 16, 2, 12, 2, 2048, 112.50, "chronicles-prequel.md:805"),
    ("181B TP2 PP24 DP8 mb1", 72, 14336, 64, 8, 2, 24, 1, 2048, 119.53, "chronicles-prequel.md:808"),
    ("181B TP2 PP24 DP8 mb2", 72, 14336, 64, 8, 2, 24, 2, 2048, 122.75, "chronicles-prequel.md:809"),
    ("181B TP4 PP24 DP4 mb1", 72, 14336, 64, 4, 4, 24, 1, 2048, 130.60, "chronicles-prequel.md:810"),
]

# --------------------------------------------------------------------------- OPT-175B (metaseq)
OPT_CITE = ("Zhang et al. 2022, OPT (arXiv 2205.01068) sect. 2.4: 992 A100 80GB, FSDP with Megatron-LM tensor "
            "parallelism (TP 8), 'up to 147 TFLOP/s per GPU'; Table 1: 96 layers, 96 heads, h 12288, batch ~2M "
            "tokens")
OPT_NOTE = ("step time = FLOPs per iteration / (992 x 147 TFLOP/s), FLOPs by Megatron-2's formula (Narayanan et al. "
            "2021 eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), the recomputed forward of full checkpointing counted): "
            "OPT ran Megatron-LM's tensor-parallel layers, and Meta's FSDP team reported TFLOP/s the same year "
            "'using the formulas from the Megatron-2 paper' (Belevich, Zhao et al., PyTorch blog, Mar 2022, "
            "'Training a 1 Trillion Parameter Model With PyTorch FSDP on AWS'); the planner's own convention "
            "(3 passes) would give a 25% shorter step. Global batch taken as 992 sequences of 2048 (8 per "
            "data-parallel rank, ~2.03M tokens): the paper's '2M' does not divide 124 ranks. 'Up to' figure, "
            "convention inferred: approximate")

# --------------------------------------------------------------------------- LLaMA 1 / Llama 2 (Meta, A100 80GB)
LLAMA1_CITE = ("Touvron et al. 2023a, LLaMA (arXiv 2302.13971): Table 2 (shapes, 4M-token batches, 1.0T / 1.4T "
               "tokens), Table 15 (GPU-hours: 82,432 / 135,168 / 530,432 / 1,022,362), sect. 2.4 ('380 "
               "tokens/sec/GPU on 2048 A100 80GB' for 65B; model and sequence parallelism, efficient causal "
               "attention, checkpointing of the cheap activations)")
LLAMA2_CITE = ("Touvron et al. 2023b, Llama 2 (arXiv 2307.09288): Table 1 (2.0T tokens, 4M-token batches, seq "
               "4096, GQA for 34B/70B), Table 2 (GPU-hours on A100 80GB: 184,320 / 368,640 / 1,038,336 / "
               "1,720,320); 'the same pretraining setting as Llama 1'")
LLAMA_NOTE = ("tokens/s/GPU = training tokens / (GPU-hours x 3600) (for 65B this gives 380, the paper's own "
              "figure); step time = 4M-token batch / (tokens/s/GPU x GPUs) with 2048 GPUs (the paper's cluster "
              "size; not stated per model). GPU-hours include restarts; the layout (TP degree, micro-batch) is "
              "not published and is the planner's fastest fitting choice under TP + SP: approximate")
# (label, hidden, layers, heads, kv heads, ffn, seq, training tokens, GPU-hours)
LLAMA1 = [
    ("LLaMA-7B", 4096, 32, 32, 32, 11008, 2048, 1.0e12, 82432),
    ("LLaMA-13B", 5120, 40, 40, 40, 13824, 2048, 1.0e12, 135168),
    ("LLaMA-33B", 6656, 60, 52, 52, 17920, 2048, 1.4e12, 530432),
    ("LLaMA-65B", 8192, 80, 64, 64, 22016, 2048, 1.4e12, 1022362),
]
LLAMA2 = [
    ("Llama-2-7B", 4096, 32, 32, 32, 11008, 4096, 2.0e12, 184320),
    ("Llama-2-13B", 5120, 40, 40, 40, 13824, 4096, 2.0e12, 368640),
    ("Llama-2-34B", 8192, 48, 64, 8, 22016, 4096, 2.0e12, 1038336),
    ("Llama-2-70B", 8192, 80, 64, 8, 28672, 4096, 2.0e12, 1720320),
]

# --------------------------------------------------------------------------- torchtitan (H100, FSDP2/TP/PP/CP)
TORCHTITAN_CITE = ("pytorch/torchtitan @ b5bcd76c, benchmarks/llama3_h100_202412_torchtitan.md: Tables 1-6 "
                   "(TPS/GPU at iteration 90), l.11-15 (Grand Teton: H100 96GB HBM2e, 2.4 TB/s, 500 W power limit, "
                   "400 Gb/s RDMA per GPU)")
TORCHTITAN_NOTE = ("step time = global batch x seq / (TPS/GPU x GPUs); seq 8192 unless the table says; 'selective "
                   "AC' (torchtitan's per-op policy, every second matmul recomputed) modelled as half the layers "
                   "recomputed whole (same recomputed FLOPs); under PP the local batch is split into "
                   "PP-degree micro-batches (torchtitan 9dec370 pipeline_llama.py: pipeline_parallel_microbatches unset -> parallel_dims.pp); "
                   "the GPU's peak is between H100 SXM and NVL "
                   "(l.82 footnote): the SXM figure is used, approximate")
LLAMA31 = {  # Llama 3.1 shapes (Dubey et al. 2024, Table 3)
    "8B": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn_hidden=14336),
    "70B": dict(hidden=8192, layers=80, heads=64, kv_heads=8, ffn_hidden=28672),
    "405B": dict(hidden=16384, layers=126, heads=128, kv_heads=8, ffn_hidden=53248),
}
# (label, model, seq, gpus, fsdp, tp, pp, cp, local batch, recompute, compile, float8, async_tp, interleave, TPS/GPU, line)
TORCHTITAN = [
    ("T1 8B FSDP", "8B", 8192, 8, 8, 1, 1, 1, 2, "selective", False, False, False, 1, 5762, 27),
    ("T1 8B FSDP+compile", "8B", 8192, 8, 8, 1, 1, 1, 2, "selective", True, False, False, 1, 6667, 28),
    ("T1 8B FSDP+compile+fp8", "8B", 8192, 8, 8, 1, 1, 1, 2, "selective", True, True, False, 1, 8532, 29),
    ("T2 8B FSDP8 CP1 s32k", "8B", 32768, 8, 8, 1, 1, 1, 1, "full", True, True, False, 1, 3890, 35),
    ("T2 8B FSDP4 CP2 s64k", "8B", 65536, 8, 4, 1, 1, 2, 1, "full", True, True, False, 1, 2540, 36),
    ("T2 8B FSDP2 CP4 s128k", "8B", 131072, 8, 2, 1, 1, 4, 1, "full", True, True, False, 1, 1071, 37),
    ("T2 8B FSDP1 CP8 s256k", "8B", 262144, 8, 1, 1, 1, 8, 1, "full", True, True, False, 1, 548, 38),
    ("T3 8B FSDP 128g", "8B", 8192, 128, 128, 1, 1, 1, 2, "selective", False, False, False, 1, 5605, 44),
    ("T3 8B FSDP+compile 128g", "8B", 8192, 128, 128, 1, 1, 1, 2, "selective", True, False, False, 1, 6514, 45),
    ("T3 8B FSDP+compile+fp8 128g", "8B", 8192, 128, 128, 1, 1, 1, 2, "selective", True, True, False, 1, 8380, 46),
    ("T4 70B FSDP32 TP8", "70B", 8192, 256, 32, 8, 1, 1, 16, "full", True, True, False, 1, 829, 52),
    ("T4 70B FSDP32 TP8 AsyncTP", "70B", 8192, 256, 32, 8, 1, 1, 16, "full", True, True, True, 1, 876, 53),
    ("T5 405B 3D 1F1B", "405B", 8192, 512, 8, 8, 8, 1, 32, "full", True, True, True, 1, 100, 59),
    ("T5 405B 3D interleaved", "405B", 8192, 512, 8, 8, 8, 1, 32, "full", True, True, True, 2, 128, 60),
    ("T6 405B FSDP8 CP1 s32k", "405B", 32768, 512, 8, 8, 8, 1, 8, "full", True, True, True, 1, 76, 66),
    ("T6 405B FSDP4 CP2 s64k", "405B", 65536, 512, 4, 8, 8, 2, 8, "full", True, True, True, 1, 47, 67),
    ("T6 405B FSDP2 CP4 s128k", "405B", 131072, 512, 2, 8, 8, 4, 8, "full", True, True, True, 1, 31, 68),
    ("T6 405B FSDP1 CP8 s256k", "405B", 262144, 512, 1, 8, 8, 8, 8, "full", True, True, True, 1, 16, 69),
]

# --------------------------------------------------------------------------- OLMo (Ai2's OLMo-core, H100)
OLMO_CITE = ("allenai/OLMo-core @ 7e58d128 (Mar 2025), README.md l.50-64 (throughput table: tokens per second per "
             "device 'measured on a cluster with NVIDIA H100 GPUs'), src/scripts/train/OLMo2-{1B,7B,13B}.py and "
             "Llama3-8B.py (rank micro-batch, global batch, compile, HSDP with bf16 params and fp32 reduction, no "
             "activation checkpointing), src/olmo_core/nn/transformer/config.py (shapes), data/tokenizer.py (dolma2 "
             "vocabulary 100,278 padded to 100,352)")
OLMO_NOTE = ("step time = global batch x 4096 / (TPS/device x GPUs); FSDP2 (HSDP) with compile, SDPA attention, "
             "RMSNorm + QK-norm, SwiGLU, untied output; no activation checkpointing; FP8 rows: torchao float8 "
             "linears. The GPU count of the measurement is not stated: the launcher's default of one 8-GPU node "
             "is taken (HSDP shards within the node, so per-device throughput barely depends on it). The "
             "published figures are rounded (55,000 / 10,000 TPS): approximate. OLMo's own published throughput "
             "is on H100, not the A100 the issue names: the 2024 OLMo 1 paper gives none per GPU")
OLMO_SHAPES = {  # hidden, layers, heads, kv heads, ffn (llama_like: ensure_multiple_of(int(8h/3 x mult), m))
    "OLMo2-1B": (2048, 18, 16, 16, 5632),
    "OLMo2-7B": (4096, 32, 32, 32, 11008),
    "Llama3-8B": (4096, 32, 32, 8, 14336),
    "OLMo2-13B": (5120, 40, 40, 40, 13824),
}
# (label, model, rank micro-batch (sequences), global batch (sequences), float8, TPS/device, README line)
OLMO = [
    ("OLMo2-1B bf16", "OLMo2-1B", 8, 1024, False, 55000, 54),
    ("OLMo2-1B fp8", "OLMo2-1B", 8, 1024, True, 65000, 55),
    ("OLMo2-7B bf16", "OLMo2-7B", 2, 1024, False, 10000, 56),
    ("OLMo2-7B fp8", "OLMo2-7B", 2, 1024, True, 13000, 57),
    ("Llama3-8B bf16", "Llama3-8B", 2, 1024, False, 9500, 58),
    ("Llama3-8B fp8", "Llama3-8B", 2, 1024, True, 12500, 59),
    ("OLMo2-13B bf16", "OLMo2-13B", 1, 2048, False, 4600, 60),
    ("OLMo2-13B fp8", "OLMo2-13B", 1, 2048, True, 5500, 61),
]

# --------------------------------------------------------------------------- BigScience on V100 (held out)
# Not part of the development set: a held-out check of another GPU generation (no development run is on a
# V100). Nothing is fitted on these rows; trainperf.planner.loso predicts them with the shipped constants.
BIGSCIENCE_V100_CITE = ("bigscience-workshop/bigscience @ 9e64edec: experiments/tr3m-1B3.md (1.3B benchmark on 2 "
                        "Jean Zay nodes of 4 V100, 32GB and 16GB tables, 'Speed' = s/iteration at GBS 512; config "
                        "train/tr3-1B3-baseline/tr3m-1B3-emb-norm-pile.slurm: 24 layers, h 2048, 16 heads, ffn 8192, "
                        "seq 2048, fp16, ZeRO-1), train/tr1-13B-base (13B production: tr1-13B-round1.slurm TP 2, "
                        "PP 4, MBS 1, GBS 1024, 40 layers, h 5120, 32 heads, fp16, full checkpointing, ZeRO-1; "
                        "chronicles.md and README.md iteration logs)")
BIGSCIENCE_V100_NOTE = ("Megatron-DeepSpeed 2021 on Jean Zay V100 SXM2 nodes (4 GPUs, NVLink2: two links between "
                        "each pair, 100 GB/s both directions; Omni-Path 100 Gb/s, taken as 2 links per node = 6.25 "
                        "GB/s per GPU, approximate); GPT-2 vocabulary padded to 128 x TP; the authors note Jean Zay's "
                        "speed varied by up to 40% between allocations (experiments/gpt2.md l.11): each table is one "
                        "allocation, and 'Speed' is rounded to whole seconds")
# (label, layers, hidden, heads, gpu, tp, pp, dp, micro-batch, global batch, s/iteration, recompute, approx, line)
BIGSCIENCE_V100 = [
    ("1B3 32GB TP1 PP1 DP8 mb1 ckpt", 24, 2048, 16, "v100-32gb", 1, 1, 8, 1, 512, 29, "full", False, "tr3m-1B3.md:22"),
    ("1B3 32GB TP1 PP1 DP8 mb2 ckpt", 24, 2048, 16, "v100-32gb", 1, 1, 8, 2, 512, 29, "full", False, "tr3m-1B3.md:23"),
    ("1B3 32GB TP1 PP1 DP8 mb4 ckpt", 24, 2048, 16, "v100-32gb", 1, 1, 8, 4, 512, 28, "full", False, "tr3m-1B3.md:24"),
    ("1B3 32GB TP1 PP1 DP8 mb8 ckpt", 24, 2048, 16, "v100-32gb", 1, 1, 8, 8, 512, 28, "full", False, "tr3m-1B3.md:25"),
    ("1B3 32GB TP1 PP2 DP4 mb1 ckpt", 24, 2048, 16, "v100-32gb", 1, 2, 4, 1, 512, 30, "full", False, "tr3m-1B3.md:26"),
    ("1B3 32GB TP1 PP2 DP4 mb2 ckpt", 24, 2048, 16, "v100-32gb", 1, 2, 4, 2, 512, 29, "full", False, "tr3m-1B3.md:27"),
    ("1B3 32GB TP1 PP2 DP4 mb8 ckpt", 24, 2048, 16, "v100-32gb", 1, 2, 4, 8, 512, 29, "full", False, "tr3m-1B3.md:28"),
    ("1B3 32GB TP1 PP4 DP2 mb1 ckpt", 24, 2048, 16, "v100-32gb", 1, 4, 2, 1, 512, 32, "full", False, "tr3m-1B3.md:30"),
    ("1B3 32GB TP1 PP4 DP2 mb8 ckpt", 24, 2048, 16, "v100-32gb", 1, 4, 2, 8, 512, 32, "full", False, "tr3m-1B3.md:31"),
    ("1B3 32GB TP2 PP1 DP4 mb1 ckpt", 24, 2048, 16, "v100-32gb", 2, 1, 4, 1, 512, 53, "full", False, "tr3m-1B3.md:32"),
    ("1B3 32GB TP1 PP1 DP8 mb1", 24, 2048, 16, "v100-32gb", 1, 1, 8, 1, 512, 23, "none", False, "tr3m-1B3.md:44"),
    ("1B3 32GB TP1 PP2 DP4 mb1", 24, 2048, 16, "v100-32gb", 1, 2, 4, 1, 512, 23, "none", False, "tr3m-1B3.md:45"),
    ("1B3 32GB TP1 PP4 DP2 mb1", 24, 2048, 16, "v100-32gb", 1, 4, 2, 1, 512, 25, "none", False, "tr3m-1B3.md:46"),
    ("1B3 32GB TP1 PP4 DP2 mb2", 24, 2048, 16, "v100-32gb", 1, 4, 2, 2, 512, 24, "none", False, "tr3m-1B3.md:47"),
    ("1B3 32GB TP2 PP1 DP4 mb1", 24, 2048, 16, "v100-32gb", 2, 1, 4, 1, 512, 39, "none", False, "tr3m-1B3.md:48"),
    ("1B3 16GB TP1 PP1 DP8 mb1 ckpt", 24, 2048, 16, "v100-16gb", 1, 1, 8, 1, 512, 29, "full", False, "tr3m-1B3.md:94"),
    ("1B3 16GB TP1 PP2 DP4 mb1 ckpt", 24, 2048, 16, "v100-16gb", 1, 2, 4, 1, 512, 30, "full", False, "tr3m-1B3.md:95"),
    ("1B3 16GB TP1 PP2 DP4 mb2 ckpt", 24, 2048, 16, "v100-16gb", 1, 2, 4, 2, 512, 29, "full", False, "tr3m-1B3.md:96"),
    ("1B3 16GB TP1 PP2 DP4 mb4 ckpt", 24, 2048, 16, "v100-16gb", 1, 2, 4, 4, 512, 28, "full", False, "tr3m-1B3.md:97"),
    ("1B3 16GB TP1 PP4 DP2 mb1 ckpt", 24, 2048, 16, "v100-16gb", 1, 4, 2, 1, 512, 32, "full", False, "tr3m-1B3.md:99"),
    ("1B3 16GB TP1 PP4 DP2 mb4 ckpt", 24, 2048, 16, "v100-16gb", 1, 4, 2, 4, 512, 30, "full", False, "tr3m-1B3.md:100"),
    ("1B3 16GB TP1 PP8 DP1 mb1 ckpt", 24, 2048, 16, "v100-16gb", 1, 8, 1, 1, 512, 37, "full", False, "tr3m-1B3.md:102"),
    ("1B3 16GB TP1 PP8 DP1 mb4 ckpt", 24, 2048, 16, "v100-16gb", 1, 8, 1, 4, 512, 35, "full", False, "tr3m-1B3.md:103"),
    # 32 nodes during the batch-size ramp: "784 samples in 32 seconds" (a rounded rate, GBS 784)
    ("13B 128 GPUs TP2 PP4 DP16", 40, 5120, 32, "v100-32gb", 2, 4, 16, 1, 784, 32.0, "full", True,
     "tr1-13B-base/chronicles.md:146"),
    ("13B 256 GPUs TP2 PP4 DP32", 40, 5120, 32, "v100-32gb", 2, 4, 32, 1, 1024, 22.3066, "full", False,
     "tr1-13B-base/chronicles.md:162"),
    ("13B 512 GPUs TP2 PP4 DP64", 40, 5120, 32, "v100-32gb", 2, 4, 64, 1, 1024, 13.2482, "full", False,
     "tr1-13B-base/README.md:600"),
]
