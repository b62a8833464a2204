"""Upper bounds on sizes, shared by the config schema and the command-line flags.

Far above any published run (GPT-3: 96 layers, 96 heads, hidden 12288; vocabularies of 256k; contexts of
10M tokens; 100k-GPU clusters), low enough that a typo (a few extra digits) is refused when it is read
instead of hanging a divisor search or allocating exabytes."""

MAX_LAYERS = 2**14
MAX_HEADS = 2**14
MAX_HIDDEN = 2**20
MAX_CONTEXT = 2**26
MAX_VOCAB = 2**26
MAX_BATCH = 2**30  # sequences (global batch, micro-batch, pipeline micro-batches)
MAX_DEGREE = 2**20  # GPUs, ranks, parallel degrees
