"""``trainperf launch``: run ``trainperf train`` under torchrun, or write a Slurm batch script.

    trainperf launch --nproc-per-node 4 CONFIG [--set k=v ...]
    trainperf launch --nnodes 2 --node-rank 0 --rdzv-endpoint host:29500 --nproc-per-node 8 CONFIG
    trainperf launch --slurm --nnodes 4 --nproc-per-node 8 --partition gpu --time 04:00:00 CONFIG \\
        [--output job.sbatch]

The layout is checked against the world size (nnodes x nproc-per-node) before anything starts, and so
are the rendezvous (several nodes need --rdzv-endpoint HOST:PORT, or --slurm) and a --resume PATH.
"""

from __future__ import annotations

import os
import re
import shlex
import sys

from trainperf.cli._common import add_config_args


def register(subparsers) -> None:
    p = subparsers.add_parser("launch", help="run train under torchrun, or write a Slurm sbatch script",
                              description=__doc__)
    add_config_args(p)
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (one per GPU)")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (static rendezvous)")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="rendezvous endpoint for several nodes (default: --standalone on one node)")
    p.add_argument("--resume", default="auto", metavar="auto|never|PATH",
                   help="passed to trainperf train; a PATH (checkpoint file or DCP directory) must exist here "
                        "before anything starts (not checked with --slurm: the job's nodes read it)")
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="restart the workers up to N times after one fails (torchrun's elastic restart); each "
                        "restart resumes from the newest complete checkpoint (set checkpoint.every)")
    p.add_argument("--dry-run", action="store_true", help="print the command (or script) instead of running it")
    s = p.add_argument_group("slurm")
    s.add_argument("--slurm", action="store_true", help="write an sbatch script instead of launching")
    s.add_argument("--output", default=None, help="where to write the sbatch script (default: stdout)")
    s.add_argument("--job-name", default="trainperf", help="Slurm job name")
    s.add_argument("--partition", default=None, help="Slurm partition")
    s.add_argument("--account", default=None, help="Slurm account")
    s.add_argument("--time", default="01:00:00", help="Slurm time limit")
    s.add_argument("--cpus-per-task", type=int, default=None, help="CPUs per node task (default: 8 per process)")
    s.add_argument("--port", type=int, default=29500, help="rendezvous port on the first node")
    p.set_defaults(func=run)


def check_layout(args) -> None:
    """Check before spawning what can be checked: the config loads, its layout fits nnodes x nproc-per-node
    processes (ParallelDims), the batch splits, the model shape fits; on this node (not --slurm, which
    runs elsewhere) the whole resolution against this machine's hardware. ConfigError: exit 2."""
    from trainperf.config import load_config
    from trainperf.config.resolve import DeviceFacts, check_batch, check_pipeline_schedule, resolve_global_batch
    from trainperf.distributed.parallel_dims import ParallelDims
    from trainperf.errors import ConfigError
    from trainperf.train.resolve import check_model_shape, derive_data_degree, resolve

    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise ConfigError(f"--nproc-per-node={args.nproc_per_node} and --nnodes={args.nnodes} must be at least 1")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts={args.max_restarts} must be >= 0 (0: no restart)")
    if args.node_rank is not None and not 0 <= args.node_rank < args.nnodes:
        raise ConfigError(f"--node-rank={args.node_rank} must be between 0 and --nnodes - 1 ({args.nnodes - 1})")
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port={args.port} must be a TCP port, 1-65535 (default 29500)")
    if args.cpus_per_task is not None and args.cpus_per_task < 1:
        raise ConfigError(f"--cpus-per-task={args.cpus_per_task} must be at least 1 (CPUs per node task)")
    _check_text_flags(args)
    from trainperf.limits import MAX_DEGREE

    world = args.nproc_per_node * args.nnodes
    if world > MAX_DEGREE:
        raise ConfigError(f"--nnodes x --nproc-per-node = {args.nnodes} x {args.nproc_per_node} = {world} processes is "
                          f"above {MAX_DEGREE}; give the node count and the processes per node (one per GPU)")
    if not args.slurm:  # --slurm rendezvous on the allocation's first node, and its nodes read --resume
        if args.nnodes > 1 and not args.rdzv_endpoint:
            raise ConfigError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (every node must reach the same "
                              "rendezvous; e.g. --rdzv-endpoint node001:29500 on every node), or use --slurm")
        _check_resume(args.resume)
    cfg = load_config(args.config, args.overrides)
    if args.slurm:  # the allocation's hardware is not this machine's: structural checks only
        cfg.parallelism.data = derive_data_degree(cfg, world)
        ParallelDims.from_config(cfg, world)
        resolve_global_batch(cfg)
        check_batch(cfg)
        check_model_shape(cfg)
        check_pipeline_schedule(cfg)
        return
    facts = DeviceFacts.probe()
    facts.local_ranks = args.nproc_per_node
    resolved = resolve(cfg, facts, world_size=world)
    _warn_oversubscribed(resolved.cfg, args.nproc_per_node)


def _warn_oversubscribed(cfg, local_ranks: int) -> None:
    """On CPU, more ranks x threads than usable CPUs slow every rank down (and the diagnosis would read it as
    another job's contention): said before the launch."""
    import warnings

    if cfg.run.device != "cpu":
        return
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    threads = cfg.run.threads if isinstance(cfg.run.threads, int) else 1
    if local_ranks * threads > usable:
        warnings.warn(f"--nproc-per-node {local_ranks} x run.threads={threads} = {local_ranks * threads} threads on "
                      f"{usable} usable CPU(s): the ranks will share cores and every step slows down (a "
                      f"host_contention finding then comes from this job's own ranks); use --nproc-per-node "
                      f"{max(1, usable // threads)} or fewer on this machine", UserWarning, stacklevel=2)


def train_args(args) -> list[str]:
    out = ["-m", "trainperf", "train", args.config]
    for item in args.overrides:
        out += ["--set", item]
    if args.resume != "auto":
        out += ["--resume", args.resume]
    return out


def torchrun_command(args) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc_per_node}"]
    if args.nnodes == 1 and not args.rdzv_endpoint:
        cmd.append("--standalone")
    else:
        cmd.append(f"--nnodes={args.nnodes}")
        if args.rdzv_endpoint:
            cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
        if args.node_rank is not None:
            cmd.append(f"--node-rank={args.node_rank}")
    if args.max_restarts:
        cmd.append(f"--max-restarts={args.max_restarts}")
    return cmd + train_args(args)


SBATCH_MARK = "# written by `trainperf launch --slurm` (it replaces this file when asked to write it again)"


def _check_output_file(args, out: str) -> None:
    """--output never replaces the config it launches, nor a file that is not a script this command wrote."""
    from trainperf.errors import ConfigError

    cfg = getattr(args, "config", None)
    if cfg and os.path.exists(cfg) and os.path.exists(out) and os.path.samefile(cfg, out):
        raise ConfigError(f"--output {args.output!r} is the config being launched: the script would replace it "
                          "(and then run itself as the config); give another file name, e.g. train.sbatch")
    if os.path.lexists(out):
        if not os.path.isfile(out):
            raise ConfigError(f"--output {args.output!r} exists and is not a regular file; give a new file name, "
                              "e.g. train.sbatch")
        try:
            with open(out, "rb") as f:
                head = f.read(4096)
        except OSError as exc:
            raise ConfigError(f"--output {args.output!r} cannot be read ({exc.strerror or exc}); give a new file "
                              "name") from None
        if SBATCH_MARK.encode() not in head:
            raise ConfigError(f"--output {args.output!r} exists and is not an sbatch script `trainperf launch` "
                              "wrote: it would be replaced; give a new file name, or move that file first")


def sbatch_script(args) -> str:
    """An sbatch script: one task per node, each running torchrun with --nproc-per-node processes."""
    cpus = args.cpus_per_task or 8 * args.nproc_per_node
    lines = [
        "#!/bin/bash",
        SBATCH_MARK,
        f"#SBATCH --job-name={args.job_name}",
        f"#SBATCH --nodes={args.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={args.nproc_per_node}",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --time={args.time}",
    ]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    lines += [
        f"#SBATCH --output={args.job_name}-%j.out",
        "",
        "set -euo pipefail",
        "# Rendezvous on the first node of the allocation.",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export OMP_NUM_THREADS={max(1, cpus // args.nproc_per_node)}",
        "# Fail fast: a failed or hung collective ends the job after distributed.timeout_s",
        "# (error handling is never turned off: that lets a failed job hang).",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
        "",
        "srun --kill-on-bad-exit=1 python -m torch.distributed.run \\",
        "    --nnodes=\"$SLURM_NNODES\" \\",
        f"    --nproc-per-node={args.nproc_per_node} \\",
        "    --rdzv-id=\"$SLURM_JOB_ID\" --rdzv-backend=c10d \\",
        f"    --rdzv-endpoint=\"$head_node:{args.port}\" \\",
        *([f"    --max-restarts={args.max_restarts} \\"] if args.max_restarts else []),
        "    " + " ".join(shlex.quote(a) for a in train_args(args)),
        "",
    ]
    return "\n".join(lines)


_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2}|"
                         r"infinite|UNLIMITED)$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9._+,@-]+$")


_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")


def _endpoint_problem(ep: str) -> str | None:
    """What is wrong with a rendezvous endpoint (HOST, HOST:PORT, [IPv6] or [IPv6]:PORT), or None. HOST is a
    host name or an IP address: no spaces, no shell or URL characters."""
    import ipaddress

    if ep.startswith("["):
        m = re.fullmatch(r"\[([^\]]*)\](?::(.*))?", ep)
        host, port = (m.group(1), m.group(2)) if m else (ep, None)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} in brackets is not an IPv6 address"
    else:
        host, sep, port = ep.rpartition(":")
        if not sep:
            host, port = ep, None
        if ":" in host:
            return "an IPv6 address goes in brackets, e.g. [fd00::1]:29500"
        if not host:
            return "the host is missing"
        if not _HOST_NAME.match(host) or ".." in host:
            return (f"host {host!r} is not a host name or IP address (letters, digits, '.', '-' and '_' only: no "
                    "spaces or shell characters)")
    if port is not None and not (re.fullmatch(r"[0-9]{1,5}", port) and 1 <= int(port) <= 65535):
        return f"port {port!r} is not a whole number in 1-65535"
    return None


def _check_resume(resume: str) -> None:
    """``--resume PATH`` names a checkpoint that exists on this node (a file, or a DCP directory), checked
    before any process starts; auto and never are modes."""
    from trainperf.errors import ConfigError

    if resume in ("auto", "never"):
        return
    if not resume.strip():
        raise ConfigError("--resume '': give auto (the newest checkpoint in the run directory, the default), never "
                          "(start over) or the path of a checkpoint")
    if not os.path.exists(resume):
        raise ConfigError(f"--resume {resume!r}: no such file or directory; give the path of a checkpoint (e.g. "
                          "RUN_DIR/checkpoints/step-00000100.pt), or auto (the newest checkpoint in the run "
                          "directory) or never (start over)")


def _check_text_flags(args) -> None:
    """Values that go into the torchrun command or the sbatch script verbatim: a rendezvous endpoint torchrun
    can parse, a time limit and names Slurm accepts (an '#SBATCH' line is split at spaces, so a job name with a
    space or ';' became other options)."""
    from trainperf.errors import ConfigError

    ep = args.rdzv_endpoint
    if ep is not None:
        problem = _endpoint_problem(ep)
        if problem:
            raise ConfigError(f"--rdzv-endpoint {ep!r}: give HOST or HOST:PORT with a port in 1-65535 (e.g. "
                              f"node001:29500): {problem}")
    if args.slurm:
        if not _SLURM_TIME.match(args.time):
            raise ConfigError(f"--time {args.time!r}: not a Slurm time limit; use minutes, MM:SS, HH:MM:SS or "
                              "D-HH:MM:SS (e.g. 04:00:00)")
        for flag, value in (("--job-name", args.job_name), ("--partition", args.partition),
                            ("--account", args.account)):
            if value is not None and not _SLURM_NAME.match(value):
                raise ConfigError(f"{flag} {value!r}: use letters, digits and . _ - + , @ only (it goes on an "
                                  "#SBATCH line, which Slurm splits at spaces)")
        if args.output:
            out = os.path.abspath(args.output)
            if os.path.isdir(out):
                raise ConfigError(f"--output {args.output!r} is a directory; give a file name, e.g. "
                                  f"{os.path.join(args.output, 'train.sbatch')}")
            if not os.path.isdir(os.path.dirname(out)):
                raise ConfigError(f"--output {args.output!r}: directory {os.path.dirname(out)} does not exist")
            _check_output_file(args, out)


def run(args) -> int:
    check_layout(args)
    if args.slurm:
        text = sbatch_script(args)
        if args.output:
            from trainperf.runio import atomic_write_text

            replaced = os.path.exists(args.output)  # only a script this command wrote (check_layout)
            atomic_write_text(args.output, text)  # a script is there whole or not at all
            os.chmod(args.output, 0o755)
            print(f"{'replaced' if replaced else 'wrote'} {args.output}: submit with `sbatch {args.output}`")
        else:
            sys.stdout.write(text)
        return 0
    cmd = torchrun_command(args)
    if args.dry_run:
        print(" ".join(shlex.quote(c) for c in cmd))
        return 0
    return run_torchrun(cmd[3:])  # the arguments after "python -m torch.distributed.run"


def run_torchrun(torchrun_argv: list[str]) -> int:
    """torchrun in this process (its elastic agent), so that a failed worker ends in one line and an exit
    code rather than torchrun's ChildFailedError traceback: 2 when a worker refused its input (a
    UserError: rank 0 printed it), else 1 naming the first failed rank and its exit code or signal."""
    import logging

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the agent's "failed (exitcode: 2)" line would repeat a refusal rank 0 already printed
    quiet = _QuietRefusal()
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent_log.addFilter(quiet)
    try:
        torchrun.run(torchrun.parse_args(torchrun_argv))
    except SignalException as exc:  # Ctrl-C / SIGTERM: the agent handed it to the ranks and waited for them
        from trainperf import interrupt

        code = 128 + int(exc.sigval)
        interrupt.record(int(exc.sigval))  # stopped by a signal: the CLI ends through interrupt.exit_now
        print(f"trainperf launch: {interrupt.describe(code)}: the ranks were stopped", file=sys.stderr)
        return code
    except ChildFailedError as exc:
        failures = sorted(exc.failures.items())
        if any(f.exitcode == 2 for _, f in failures):  # trainperf's exit code for a UserError
            print("trainperf launch: stopped: the run was refused (the message above); nothing was trained "
                  "past that point", file=sys.stderr)
            return 2
        # the rank that failed first (the others end after it, through fail-fast): by the agent's timestamps
        rank, f = min(failures, key=lambda rf: (getattr(rf[1], "timestamp", 0) or 0, rf[0]))
        how = f"signal {f.signal_name()}" if f.exitcode < 0 else f"exit code {f.exitcode}"
        diverged = [r for r, x in failures if _failure_message(x).startswith("DivergedError")]
        if diverged:
            print(f"trainperf launch: failed: the loss diverged on rank {diverged[0]} (what to change is above); "
                  "a restart from the newest checkpoint would diverge again, so none is suggested",
                  file=sys.stderr)
            return 1
        hint = "" if any(a.startswith("--max-restarts") for a in torchrun_argv) else \
            "; --max-restarts N restarts the job from its newest checkpoint"
        others = [r for r, _ in failures if r != rank]
        also = f"; rank(s) {', '.join(map(str, others))} ended after it" if others else ""
        print(f"trainperf launch: failed: rank {rank} ended first, with {how} (its report is above{hint}{also})",
              file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - torchrun itself (rendezvous, ports): one line, not its traceback
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), "")[:300]
        print(f"trainperf launch: torchrun failed: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1
    finally:
        agent_log.removeFilter(quiet)
    return 0


def _failure_message(failure) -> str:
    """What a failed rank recorded in its torchrun error file ("Type: text"), or ''."""
    m = getattr(failure, "message", "")
    if isinstance(m, dict):
        m = m.get("message", "")
    return m if isinstance(m, str) else ""


class _QuietRefusal:
    """A logging filter for the agent: drops its "failed (exitcode: 2)" line (rank 0 printed the refusal) and
    its "closing signal" lines (the stopped ranks say so in their own report, and launch names the failed rank)."""

    def filter(self, record) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to judge
            return True
        return "(exitcode: 2)" not in msg and "closing signal" not in msg
