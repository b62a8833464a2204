"""``trainperf tune``: from a config to the fastest settings that fit, found by short measured trials.

    space.py   the dimensions (micro-batch, checkpointing, precision, compile, loader, layouts)
    fit.py     the memory estimate that prunes candidates before anything runs
    trial.py   one trial through the ordinary trainer; two candidates measured side by side
    search.py  coordinate descent within a time budget; the choice; the tuned YAML
    result.py  trial records, the --json document, the table, the tune directory's files
"""
