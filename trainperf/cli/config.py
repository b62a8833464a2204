"""``trainperf config show CONFIG [--set ...] [--json]`` and ``trainperf config schema``."""

from __future__ import annotations

from trainperf.cli._common import add_config_args, add_json_flag, print_json, whole


def register(subparsers) -> None:
    p = subparsers.add_parser("config", help="show the resolved config, or its JSON Schema")
    sub = p.add_subparsers(dest="config_cmd", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print the resolved tree; fields resolved from 'auto' are marked with why")
    add_config_args(show)
    show.add_argument("--world-size", type=whole(1), default=None,
                      help="resolve for this many processes (default: WORLD_SIZE, or the product of explicit degrees)")
    add_json_flag(show)
    show.set_defaults(func=run_show)
    schema = sub.add_parser("schema", help="print the JSON Schema of the config (descriptions = field docs)")
    schema.set_defaults(func=run_schema)


def _world_size(cfg, explicit):
    if explicit:
        return explicit
    from trainperf.config.resolve import world_size_from_env

    env = world_size_from_env()
    if env > 1:
        return env
    p = cfg.parallelism
    if p.data != -1:
        return p.data * p.data_shard * p.tensor * p.pipeline
    return 1


def run_show(args) -> int:
    from trainperf.config import load_config
    from trainperf.train.resolve import resolve

    cfg = load_config(args.config, args.overrides)
    resolved = resolve(cfg, world_size=_world_size(cfg, args.world_size))
    tree = resolved.cfg.model_dump(mode="json")
    if args.json:
        print_json({"config": tree, "resolved": resolved.notes, "world_size": resolved.world_size})
        return 0
    print(f"# {args.config} resolved for world size {resolved.world_size}")
    print("# fields marked (auto: ...) were 'auto' and are resolved as the note says")
    _print_tree(tree, resolved.notes, "", 0)
    return 0


def _print_tree(node: dict, notes: dict, prefix: str, depth: int) -> None:
    pad = "  " * depth
    for key, val in node.items():
        path = f"{prefix}{key}"
        if isinstance(val, dict):
            print(f"{pad}{key}:")
            _print_tree(val, notes, path + ".", depth + 1)
        else:
            note = f"   # (auto: {notes[path]})" if path in notes else ""
            print(f"{pad}{key}: {_scalar(val)}{note}")


def _scalar(v) -> str:
    import json

    if v is None:
        return "null"
    if isinstance(v, str):
        return v
    return json.dumps(v)


def run_schema(args) -> int:
    from trainperf.config.schema import Config

    print_json(Config.model_json_schema())
    return 0
