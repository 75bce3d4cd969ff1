"""``potluck run``: flags (torchrun's names, dashes or underscores) -> LaunchConfig -> Agent."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from potluck import env as names
from potluck.errors import ConfigError, PotluckError
from potluck.launch import schedulers
from potluck.launch.agent import Agent
from potluck.launch.config import LaunchConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    def flag(name: str, **kwargs: object) -> None:
        spellings = [f"--{name}"]
        if "-" in name:
            spellings.append("--" + name.replace("-", "_"))
        parser.add_argument(*spellings, **kwargs)  # type: ignore[arg-type]

    flag("nproc-per-node", default=None, metavar="N",
         help="workers on this node: a number, or auto/cpu/gpu (default 1, or the "
              "scheduler's: docs/schedulers.md)")
    flag("nnodes", default=None, metavar="N",
         help="nodes in the job (default 1, or the scheduler's); MIN:MAX with --elastic: "
              "MIN nodes start the job, up to MAX join while it runs")
    flag("node-rank", type=int, default=None, metavar="R",
         help="this node's rank, 0..nnodes-1 (default 0, or the scheduler's); node 0 "
              "hosts the store")
    flag("master-addr", default=None, metavar="ADDR",
         help="node 0's address as every node sees it (default 127.0.0.1, or the "
              "scheduler's)")
    flag("master-port", type=int, default=None, metavar="PORT",
         help="the store's port on node 0 (default: the scheduler's, else a free port on "
              "one node, 29500 on many)")
    flag("rdzv-endpoint", default=None, metavar="HOST[:PORT]",
         help="torchrun's spelling of --master-addr and --master-port together (no port: "
              "29400, as torchrun; IPv6 in brackets: [fd00::1]:29500); with "
              "--rdzv-backend etcd: an etcd client address (no port: 2379)")
    flag("max-restarts", type=int, default=0, metavar="K",
         help="restart this node's workers up to K times after a failure (default 0)")
    flag("run-id", default=None, metavar="ID",
         help="job id, the same on every node (alias --rdzv-id; default potluck, or the "
              "scheduler's job id)")
    flag("rdzv-id", dest="run_id", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flag("grace-period", type=float, default=5.0, metavar="S",
         help="seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    flag("join-timeout", type=float, default=300.0, metavar="S",
         help="seconds to wait for node 0's store and the other nodes (default 300)")
    flag("elastic", action="store_true",
         help="restart a dead worker alone as a new member (--max-restarts in total) while "
              "the others train on; the script uses potluck.prepare or potluck.init()")
    flag("balance", action="store_true",
         help="give each worker a share of every step by its measured speed, so a slow "
              "GPU does not hold the others back (scripts on potluck.prepare; the "
              "global batch and the average stay exact)")
    flag("min-workers", type=int, default=1, metavar="N",
         help="--elastic: below N workers the cohort stops training and waits for "
              "joiners, then checkpoints and exits (default 1)")
    flag("min-workers-timeout", type=float, default=60.0, metavar="S",
         help="seconds to wait for joiners below --min-workers (default 60)")
    flag("cohort-size", type=int, default=None, metavar="N",
         help="--elastic: the cohort's wanted size; more workers wait as spares and are "
              "admitted when a member leaves or is lost (default: admit every worker)")
    flag("swap-drag", type=float, default=None, metavar="FRACTION",
         help="--elastic with --cohort-size: swap a member for a waiting spare when the "
              "cohort runs FRACTION or more below its prediction without that member "
              "(e.g. 0.3; default: never swap)")
    flag("swap-window", type=int, default=20, metavar="STEPS",
         help="steps over which --swap-drag must hold before a swap (default 20)")
    flag("no-warm-spare", dest="warm_spare", action="store_false",
         help="--elastic with --max-restarts: do not keep a worker process warm (torch "
              "imported, at the lowest CPU priority) for the next restart; restarts then "
              "pay the interpreter's start-up (seconds) and the spare's memory is saved")
    flag("status-port", type=int, default=None, metavar="PORT",
         help="serve a live status page of the cohort on PORT (0: a free one; node 0 "
              "serves it, or the node the store moved to): who computes, who waits, the "
              "slowest rank and why, events, loss and throughput; /api/status (JSON) "
              "and /metrics (Prometheus) beside it "
              "(scripts on potluck.prepare; on potluck.DataParallel alone: step times, "
              "not samples)")
    flag("status-host", default="127.0.0.1", metavar="ADDR",
         help="the address the status page listens on (default 127.0.0.1; 0.0.0.0 for "
              "every interface)")
    flag("metrics-dir", default=None, metavar="DIR",
         help="every worker writes its per-step figures to DIR/ranks/*.jsonl, for "
              "`potluck plot DIR` (scripts on potluck.prepare; on potluck.DataParallel "
              "alone: step times, not samples)")
    flag("reputation", default=None, metavar="PATH",
         help="at the end, append this machine's record (its speed, time in the cohort, "
              "losses, restarts, trust's strikes) to the file PATH, for `potluck plan "
              "--reputation PATH`; the machine's identity is kept in "
              "~/.cache/potluck/worker-id")
    flag("token", default=None, metavar="SECRET",
         help="the job's shared secret, at least 8 characters: a worker must prove it to "
              "join an elastic cohort. Visible in ps: prefer $POTLUCK_TOKEN or --token-file")
    flag("token-file", default=None, metavar="PATH",
         help="read the shared secret from the first line of PATH (e.g. mode 600)")
    flag("standalone", action="store_true",
         help="accepted for torchrun compatibility: a single node on a free port (no "
              "scheduler's variables are read)")
    flag("log-dir", default=None, metavar="DIR",
         help="also write each worker's output to DIR/RUN_ID/attempt_N/LOCAL_RANK/"
              "{stdout,stderr}.log (torchrun's layout)")
    flag("local-ranks-filter", default=None, metavar="R,R",
         help="show only these local ranks' output, e.g. 0 (all of it still goes to "
              "--log-dir)")
    # torchrun flags that need no value of their own here: accepted, and the help says why.
    flag("rdzv-backend", default="c10d", metavar="NAME",
         help="c10d or static (the default: node 0's agent hosts the job's store), or "
              "etcd: the store lives in the etcd cluster at --rdzv-endpoint, so no node "
              "hosts it (--elastic only)")
    flag("rdzv-conf", default=None, metavar="K=V,...",
         help="accepted for torchrun compatibility and ignored (timeouts: --join-timeout)")
    flag("monitor-interval", type=float, default=None, metavar="S",
         help="accepted for torchrun compatibility and ignored: potluck checks its workers "
              "every 0.05 s")
    flag("start-method", default=None, choices=("spawn", "fork", "forkserver"),
         help="accepted for torchrun compatibility and ignored: potluck starts each worker "
              "as a process of its own")
    flag("role", default=None, metavar="NAME",
         help="accepted for torchrun compatibility and ignored")
    flag("run-path", action="store_true",
         help="accepted for torchrun compatibility: the script is run as a path already")
    for name, why in _UNSUPPORTED.items():
        flag(name, nargs="?", action=_Unsupported, why=why, help=argparse.SUPPRESS)
    parser.add_argument("-m", "--module", action="store_true",
                        help="run the target as a module (python -m) instead of a file")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="arguments passed to the script unchanged")


# torchrun flags potluck run does not have, and what to do instead
_UNSUPPORTED = {
    "redirects": "every worker's output is prefixed with its rank on the terminal; "
                 "--log-dir DIR keeps each worker's stdout and stderr in files",
    "tee": "every worker's output is prefixed with its rank on the terminal; "
           "--log-dir DIR keeps each worker's stdout and stderr in files",
    "no-python": "potluck run starts a Python script or module (-m); run other programs "
                 "another way",
    "local-addr": "each worker's address is the one on its route to --master-addr (set "
                  "GLOO_SOCKET_IFNAME to pick the interface)",
    "logs-specs": "--log-dir DIR writes torchrun's default layout",
}


class _Unsupported(argparse.Action):
    """A torchrun flag potluck run does not have: refused with what to do instead."""

    def __init__(self, option_strings: list[str], dest: str, why: str = "",
                 **kwargs: object) -> None:
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]
        self.why = why

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is a torchrun flag potluck run does not support: "
                     f"{self.why}")


def scheduler_flags(args: argparse.Namespace, environ: Mapping[str, str]
                    ) -> schedulers.Resolved:
    """The flags' values, where a flag not given takes the scheduler's value (SLURM,
    Kubernetes, SkyPilot: ``schedulers``), else its default. ``--standalone`` reads no
    scheduler."""
    addr, port = args.master_addr, args.master_port
    if args.rdzv_endpoint and args.rdzv_backend != "etcd":  # it names the store
        host, port_text = split_endpoint(args.rdzv_endpoint)
        addr, port = addr or host, port or int(port_text)
    given = {"nproc_per_node": args.nproc_per_node, "nnodes": args.nnodes,
             "node_rank": args.node_rank, "master_addr": addr, "master_port": port,
             "run_id": args.run_id}
    return schedulers.resolve(given, {} if args.standalone else environ)


def config_from_args(args: argparse.Namespace,
                     flags: schedulers.Resolved | None = None) -> LaunchConfig:
    """The launch config from the parsed flags; ``flags`` fills those not given (None:
    the built-in defaults, no scheduler read)."""
    values = (flags or scheduler_flags(args, {})).values
    etcd = etcd_endpoint(args.rdzv_endpoint) if args.rdzv_backend == "etcd" else None
    if args.rdzv_endpoint and etcd is None:
        addr, port = store_address(args.master_addr, args.master_port, args.rdzv_endpoint)
    else:
        addr, port = store_address(_text(values["master_addr"]),
                                   _number(values["master_port"]), None)
    check_elastic_only(args)
    min_nodes, nnodes = parse_nnodes(str(values["nnodes"]))
    if args.rdzv_backend not in ("c10d", "static", "etcd"):
        raise ConfigError(
            f"--rdzv-backend {args.rdzv_backend!r}: potluck's rendezvous is its own store on "
            "node 0 (like torchrun's c10d) or in etcd; use --rdzv-backend c10d (or drop "
            "the flag), or --rdzv-backend etcd --rdzv-endpoint HOST:2379"
        )
    if args.monitor_interval is not None and not args.monitor_interval > 0:
        raise ConfigError(f"--monitor-interval {args.monitor_interval:g} must be a positive "
                          "number of seconds (it is accepted and ignored)")
    return LaunchConfig(
        script=args.script,
        script_args=tuple(args.script_args),
        module=args.module,
        nproc_per_node=parse_nproc(str(values["nproc_per_node"])),
        nnodes=nnodes,
        min_nodes=min_nodes,
        node_rank=_number(values["node_rank"]) or 0,
        master_addr=addr,
        master_port=port,
        max_restarts=args.max_restarts,
        run_id=str(values["run_id"]),
        grace_period=args.grace_period,
        join_timeout=args.join_timeout,
        elastic=args.elastic,
        balance=args.balance,
        token=resolve_token(args.token, args.token_file, os.environ),
        min_workers=args.min_workers,
        min_workers_timeout=args.min_workers_timeout,
        cohort_size=args.cohort_size,
        swap_drag=args.swap_drag,
        swap_window=args.swap_window,
        log_dir=args.log_dir,
        local_ranks_filter=parse_local_ranks(args.local_ranks_filter),
        warm_spare=args.warm_spare,
        status_port=args.status_port,
        status_host=args.status_host,
        metrics_dir=None if args.metrics_dir is None else os.path.abspath(args.metrics_dir),
        etcd=etcd,
    ).validated()


def _text(value: schedulers.Value | None) -> str | None:
    return None if value is None else str(value)


def _number(value: schedulers.Value | None) -> int | None:
    return None if value is None else int(value)


def store_address(master_addr: str | None, master_port: int | None,
                  rdzv_endpoint: str | None) -> tuple[str, int | None]:
    """Node 0's store address from ``--master-addr``/``--master-port`` or torchrun's
    ``--rdzv-endpoint HOST[:PORT]``: both may be given only when they agree."""
    addr, port = master_addr, master_port
    if rdzv_endpoint:
        host, port_text = split_endpoint(rdzv_endpoint)
        if master_port is not None and master_port != int(port_text):
            raise ConfigError(
                f"--rdzv-endpoint {rdzv_endpoint} and --master-port {master_port} name two "
                "different ports for the store: give the port once (either flag)"
            )
        if master_addr is not None and master_addr != host:
            raise ConfigError(
                f"--rdzv-endpoint {rdzv_endpoint} and --master-addr {master_addr} name two "
                "different hosts for the store: give the address once (either flag)"
            )
        addr, port = host, int(port_text)
    addr = "127.0.0.1" if addr is None else addr
    check_host("--rdzv-endpoint" if rdzv_endpoint else "--master-addr", addr)
    return addr, port


RDZV_DEFAULT_PORT = 29400  # torchrun's, for an --rdzv-endpoint without a port
ETCD_DEFAULT_PORT = 2379  # etcd's client port


def etcd_endpoint(endpoint: str | None) -> str:
    """``--rdzv-endpoint`` under ``--rdzv-backend etcd``: etcd's client address as
    ``HOST:PORT`` (no port: 2379; ``http://`` in front is allowed)."""
    if not endpoint:
        raise ConfigError(
            "--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT, the client address of "
            f"an etcd cluster every node can reach, e.g. etcd.example.org:{ETCD_DEFAULT_PORT}")
    bare = endpoint.strip().removeprefix("http://").rstrip("/")
    after_host = bare.rpartition("]")[2] if bare.startswith("[") else bare
    if after_host.count(":") != 1:  # no port given (or a bare IPv6 address)
        bare = f"[{bare}]" if after_host.count(":") > 1 else bare
        bare = f"{bare}:{ETCD_DEFAULT_PORT}"
    host, port_text = split_endpoint(bare)
    check_host("--rdzv-endpoint", host)
    return f"[{host}]:{port_text}" if ":" in host else f"{host}:{port_text}"


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """``HOST``, ``HOST:PORT``, ``[IPV6]`` or ``[IPV6]:PORT`` (torchrun's forms; no port:
    torchrun's 29400) as host and port text."""
    text, closed = endpoint.strip(), True
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        closed = bool(bracket)
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:  # a bare IPv6 address (no port can follow it unbracketed) or a host
        host, port_text = text, ""
    port_text = port_text or str(RDZV_DEFAULT_PORT)
    if not host or not closed or not port_text.isdigit():
        raise ConfigError(
            f"--rdzv-endpoint {endpoint!r} must look like HOST:PORT or HOST (port "
            f"{RDZV_DEFAULT_PORT}, as torchrun), e.g. 10.0.0.1:29500 or [fd00::1]:29500")
    return host, port_text


def check_host(flag: str, addr: str) -> None:
    """Refuse an address no resolver could take (empty, ``not..valid``, a label over 63
    characters), with the flag that gave it, before anything tries to connect."""
    try:
        valid = bool(addr.strip()) and bool(addr.encode("idna"))
    except UnicodeError as exc:
        reason = str(exc).rstrip(")").rpartition(": ")[2] or str(exc)
        raise ConfigError(
            f"{flag} {addr!r} is not a hostname or IP address ({reason}): a hostname's "
            "dot-separated labels must each be 1 to 63 characters; give node 0's hostname "
            "or IP as the other nodes see it, e.g. 10.0.0.1 (on one node leave it out)"
        ) from exc
    if not valid:
        raise ConfigError(f"{flag} {addr!r} is empty: give node 0's hostname or IP as the "
                          "other nodes see it, e.g. 10.0.0.1 (on one node leave it out)")


def check_elastic_only(args: argparse.Namespace) -> None:
    """Refuse flags that only an elastic run reads, instead of ignoring them."""
    if args.elastic:
        return
    given = [name for name, present in (("--token", args.token is not None),
                                        ("--token-file", args.token_file is not None),
                                        ("--no-warm-spare", not args.warm_spare)) if present]
    if given:
        raise ConfigError(
            f"{' and '.join(given)} only {'apply' if len(given) > 1 else 'applies'} to "
            "--elastic runs (a fixed job admits no new workers, so it needs no secret and "
            f"keeps no spare): add --elastic or drop {'them' if len(given) > 1 else 'it'}"
        )


def resolve_token(flag: str | None, path: str | None, environ: Mapping[str, str]) -> str | None:
    """The job's secret: ``--token``, else ``--token-file``'s first line, else
    ``$POTLUCK_TOKEN``; None if none is given."""
    if flag is not None and path is not None:
        raise ConfigError("--token and --token-file both give the secret: keep one "
                          "(--token-file keeps it out of ps)")
    if path is not None:
        try:
            with open(path, encoding="utf-8") as file:
                secret = file.readline().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {path}: cannot read it ({exc.strerror or exc}); "
                              "write the secret on its first line, e.g. openssl rand -hex 16 "
                              f"> {path}") from exc
        if not secret:
            raise ConfigError(f"--token-file {path} is empty: write the secret on its first "
                              f"line, e.g. openssl rand -hex 16 > {path}")
        return secret
    return flag or environ.get(names.TOKEN) or None


def require_token(config: LaunchConfig) -> LaunchConfig:
    """An elastic job admits workers by its token: refuse to start one without it."""
    if config.elastic and config.token is not None and not config.token.strip():
        raise ConfigError(
            f"the job's shared secret is only whitespace ({len(config.token)} character(s), "
            "from $POTLUCK_TOKEN or --token): a blank secret protects nothing; set a real one, "
            "e.g. export POTLUCK_TOKEN=$(openssl rand -hex 16)"
        )
    if config.elastic and not config.token:
        raise ConfigError(
            "--elastic needs the job's shared secret, the same on every node: export "
            "POTLUCK_TOKEN=SECRET (recommended), or --token-file PATH, or --token SECRET "
            "(visible in ps); e.g. export POTLUCK_TOKEN=$(openssl rand -hex 16)"
        )
    if config.elastic and config.token is not None:
        check_token_length(config.token)
    return config


MIN_TOKEN_LENGTH = 8


def check_token_length(token: str) -> None:
    """A secret a stranger could guess in a few tries admits the stranger: refuse one
    shorter than ``MIN_TOKEN_LENGTH`` characters (the secret itself is never echoed)."""
    length = len(token.strip())
    if length < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the job's shared secret (--token, --token-file or $POTLUCK_TOKEN) is {length} "
            f"character(s) long: it must be at least {MIN_TOKEN_LENGTH}, or a stranger "
            "could guess it; make one, the same on every node: export POTLUCK_TOKEN=$(python "
            "-c \"import secrets; print(secrets.token_hex(16))\")"
        )


def check_script(config: LaunchConfig) -> None:
    """A script file that is not there is refused once, before any worker starts (not
    once per rank and again per restart)."""
    if config.module or os.path.isfile(config.script):
        return
    where = os.path.abspath(config.script)
    hint = ("it is a directory; name the script in it" if os.path.isdir(config.script)
            else "check the path (relative to the current directory), or run a module "
                 "with -m")
    raise ConfigError(f"no script file {config.script!r} (looked at {where}): {hint}")


def parse_nproc(value: str, *, gpus: int | None = None, cpus: int | None = None) -> int:
    """A count, or torchrun's ``auto`` (GPUs if any, else CPUs), ``gpu`` or ``cpu``."""
    try:
        count = int(value)
    except ValueError:
        count = None
    if count is not None:
        if count < 1:
            raise ConfigError(f"--nproc-per-node {value} must be at least 1 (workers on this "
                              "node), or auto/cpu/gpu; e.g. 2")
        return count
    if value in ("auto", "gpu", "cpu"):
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count()
        cpus = (os.cpu_count() or 1) if cpus is None else cpus
        if value == "gpu" and gpus == 0:
            raise ConfigError("--nproc-per-node gpu, but this host sees no CUDA device")
        return cpus if value == "cpu" or gpus == 0 else gpus
    raise ConfigError(
        f"--nproc-per-node {value!r} is neither a number nor auto/cpu/gpu; e.g. 2"
    )


def parse_local_ranks(value: str | None) -> tuple[int, ...] | None:
    """torchrun's ``--local-ranks-filter 0,2``; None shows every local rank."""
    if value is None:
        return None
    words = [word.strip() for word in value.split(",")]
    if not words or not all(word.isdigit() for word in words):
        raise ConfigError(f"--local-ranks-filter {value!r} must be local ranks separated by "
                          "commas, e.g. 0 or 0,1")
    return tuple(sorted({int(word) for word in words}))


def parse_nnodes(value: str) -> tuple[int | None, int]:
    """``(MIN, MAX)`` from a count ``N`` (None, N) or torchrun's range ``MIN:MAX``."""
    low, colon, high = value.partition(":")
    if low.isdigit() and not colon:
        return None, int(low)
    if low.isdigit() and high.isdigit():
        if int(low) > int(high):
            raise ConfigError(f"--nnodes {value!r}: MIN must not exceed MAX, e.g. 1:4")
        return int(low), int(high)
    raise ConfigError(
        f"--nnodes {value!r} is neither a count nor MIN:MAX; e.g. 2, or 1:4 with --elastic"
    )


def main(args: argparse.Namespace) -> int:
    try:
        flags = scheduler_flags(args, os.environ)
        for line in (*flags.notes, schedulers.summary(flags)):
            if line:
                _emit(f"potluck run: {line}")
        config = require_token(config_from_args(args, flags))
        check_script(config)
        check_writable_dir("--log-dir", config.log_dir, example="logs")
        check_writable_dir("--metrics-dir", config.metrics_dir, example="runs/metrics")
        if getattr(args, "reputation", None) is None:
            return Agent(config, emit=_emit).run()
        return run_recorded(config, args.reputation)
    except ConfigError as exc:
        print(f"potluck run: {exc}", file=sys.stderr)
        return 2
    except PotluckError as exc:  # RendezvousError and friends: say it once, no traceback
        print(f"potluck run: {exc}", file=sys.stderr)
        return 1


def run_recorded(config: LaunchConfig, path: str) -> int:
    """Run the agent, then append this machine's record to ``path``."""
    from potluck.launch.ledger import Ledger

    ledger = Ledger(path)
    config = ledger.with_journals(config)
    code = Agent(config, emit=_emit).run()
    record = ledger.write(config, code)
    if record is not None:
        _emit(f"potluck run: recorded {record.worker} in {path}: "
              f"{record.samples_per_s or 0:.1f} samples/s, {record.in_cohort_s:.0f} s in "
              f"the cohort, lost {record.losses} times, restarted {record.restarts}")
    return code


def check_writable_dir(flag: str, path: str | None, *, example: str) -> None:
    """A directory flag (``--log-dir``, ``--metrics-dir``) that cannot be written is
    refused before any worker starts, not by every worker as it writes there. It is
    created if it is missing."""
    if path is None:
        return
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".potluck-write-test-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        what = ("it is a file, not a directory" if os.path.isfile(path)
                else f"cannot write there ({exc.strerror or exc})")
        raise ConfigError(f"{flag} {path}: {what}; pick a directory this user can write "
                          f"(it is created if missing), e.g. {flag} {example}") from exc


def _emit(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
