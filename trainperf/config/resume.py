"""The resume policy both checkpointers share (one process: :mod:`trainperf.train.checkpoint`; sharded:
:mod:`trainperf.distributed.checkpoint`): which settings of the saved run a resume must keep, which it may
change (said, since they move the learning rate), and where ``--resume never`` keeps the previous run's
checkpoints. It compares two configs as dumped (``Config.model_dump(mode="json")``, the form a checkpoint
stores) and imports nothing but the errors.
"""

from __future__ import annotations

from pathlib import Path

from trainperf.errors import CheckpointError

RESUME_KEYS = ("model", "data.source", "data.path", "train.global_batch")
"""What a resume must keep: the model, its data and the global batch (the loader position counts batches)."""


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part, {}) if isinstance(d, dict) else {}
    return d


def check_resume_compatible(saved: dict, current: dict) -> None:
    """Refuse a checkpoint whose model, data or global batch differ from this run's config."""
    for key in RESUME_KEYS:
        if _get(saved, key) != _get(current, key):
            key, was, now = _first_difference(key, _get(saved, key), _get(current, key))
            raise CheckpointError(
                f"the checkpoint was written with {key}={was!r} but this run has {now!r}; "
                "resume with the same setting, or start over with --resume never (or another run.dir)"
            )


SCHEDULE_KEYS = ("run.steps", "optimizer", "schedule")
"""What a resume may change (unlike RESUME_KEYS) but what moves the learning rate from the resume step on."""


def schedule_change_notes(saved: dict, current: dict) -> list[str]:
    """One line per setting of the saved run that this run changes and that reshapes the learning-rate
    schedule from the resume step on (the resume itself is exact; the rate is not the saved run's)."""
    out = []
    for key in SCHEDULE_KEYS:
        was, now = _get(saved, key), _get(current, key)
        if was is not None and was != now:
            k, a, b = _first_difference(key, was, now)
            out.append(f"resume: {k} was {a!r} in the checkpoint's run and is {b!r} now: the learning rate follows "
                       "the new setting from the resume step on (it may jump there)")
    return out


def _first_difference(key: str, was, now) -> tuple[str, object, object]:
    """The innermost key where two config sections differ (``model.n_layer: 2`` rather than both whole dicts)."""
    while isinstance(was, dict) and isinstance(now, dict):
        diff = next((k for k in sorted(set(was) | set(now), key=str) if was.get(k) != now.get(k)), None)
        if diff is None:
            break
        key, was, now = f"{key}.{diff}", was.get(diff), now.get(diff)
    return key, was, now


def previous_dir(directory: Path) -> Path:
    """Where ``--resume never`` keeps the previous run's checkpoints until the new run has written its own."""
    return directory.with_name(directory.name + ".previous")
