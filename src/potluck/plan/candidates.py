"""The candidates file of ``potluck plan`` (TOML or JSON, the same fields).

    [job]
    parameters = 124_000_000   # or give --model and --calibrate
    global_batch = 256
    bytes_per_param = 4        # on the wire before a codec (default 4: float32)
    inner_steps = [10, 50, 200]  # DiLoCo's H to price (default these)

    [target]                   # optional: a rate, or N samples within a time
    samples_per_s = 2000       # or: samples = 1e9 and within_h = 24

    [overheads]                # optional; --calibrate measures step_s and round_s
    step_s = 0.002
    round_s = 0.05
    overlap = 0.5
    cpu_s_per_byte = 2e-9      # the all-reduce's CPU work per byte a member sends

    [[regions]]                # one-way latency between two regions (default 40 ms)
    a = "eu"
    b = "us"
    latency_ms = 45

    [[machine]]
    name = "a100-1"
    id = "lab-a100-1"          # its worker identity in the reputation record (default: name)
    speed = 410                # samples/s on the job; leave out to measure it here
    up_mbit = 1000
    down_mbit = 1000
    latency_ms = 2             # to its region's exchange point
    region = "eu"
    price_per_h = 1.20
    cores = 4                  # optional: the CPU cores its worker gets, if it trains on CPU

``parse`` turns the parsed document into a ``Candidates``; a missing or bad field is a
``ConfigError`` naming the machine, the field and an example.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from potluck.errors import ConfigError
from potluck.plan.machines import Machine, Overheads
from potluck.plan.ring import Distances


@dataclass(frozen=True)
class Entry:
    """One machine as the file gives it; ``speed`` None: to be measured or recalled."""

    name: str
    identity: str
    speed: float | None
    up_bps: float
    down_bps: float
    latency_s: float
    region: str
    price_per_h: float | None
    cores: float | None = None

    def machine(self, speed: float) -> Machine:
        return Machine(self.name, speed, self.up_bps, self.down_bps, self.latency_s,
                       self.region, self.price_per_h, self.cores)


@dataclass(frozen=True)
class Candidates:
    entries: tuple[Entry, ...]
    parameters: int | None
    global_batch: int
    bytes_per_param: int
    inner_steps: tuple[int, ...]
    overheads: Overheads
    distances: Distances
    target: float | None  # samples a second
    samples: float | None  # the target's N samples, if it was given so


def load(path: str | Path) -> Candidates:
    """Read ``path`` (``.json``: JSON; anything else: TOML)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"candidates file {file}: {exc.strerror or exc}") from exc
    try:
        document = json.loads(text) if file.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"candidates file {file} does not parse: {exc}") from exc
    return parse(document, str(file))


def parse(document: Mapping[str, Any], where: str = "candidates") -> Candidates:
    job = _table(document, "job", where)
    machines = document.get("machine")
    if not isinstance(machines, list) or not machines:
        raise ConfigError(f"{where}: no [[machine]] tables; give one per candidate, e.g. "
                          "[[machine]] name = \"a\" speed = 400 up_mbit = 1000 "
                          "down_mbit = 1000")
    entries = tuple(_entry(m, i, where) for i, m in enumerate(machines))
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}: machine names repeat ({names}); give each its own")
    overheads = Overheads(**{k: float(v) for k, v in _table(document, "overheads",
                                                              where).items()})
    target, samples = _target(_table(document, "target", where), where)
    parameters = job.get("parameters")
    return Candidates(
        entries=entries, parameters=None if parameters is None else int(parameters),
        global_batch=int(_need(job, "global_batch", f"{where} [job]", "256")),
        bytes_per_param=int(job.get("bytes_per_param", 4)),
        inner_steps=tuple(int(h) for h in job.get("inner_steps", (10, 50, 200))),
        overheads=overheads, distances=_distances(document.get("regions", []), where),
        target=target, samples=samples)


def _entry(raw: Any, index: int, where: str) -> Entry:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: machine {index} is not a table")
    name = str(raw.get("name", f"machine {index}"))
    at = f"{where}: machine {name!r}"
    speed = raw.get("speed")
    price = raw.get("price_per_h")
    cores = raw.get("cores")
    return Entry(name=name, identity=str(raw.get("id", name)),
                 speed=None if speed is None else float(speed),
                 up_bps=float(_need(raw, "up_mbit", at, "1000")) * 1e6,
                 down_bps=float(_need(raw, "down_mbit", at, "1000")) * 1e6,
                 latency_s=float(raw.get("latency_ms", 0.0)) / 1e3,
                 region=str(raw.get("region", "")),
                 price_per_h=None if price is None else float(price),
                 cores=None if cores is None else float(cores))


def _target(table: Mapping[str, Any], where: str) -> tuple[float | None, float | None]:
    samples = table.get("samples")
    if "samples_per_s" in table:
        return float(table["samples_per_s"]), None if samples is None else float(samples)
    if samples is not None and "within_h" in table:
        return float(samples) / (float(table["within_h"]) * 3600.0), float(samples)
    if table and samples is None:
        raise ConfigError(f"{where} [target]: give samples_per_s, or samples with within_h "
                          "(e.g. samples = 1e9, within_h = 24)")
    return None, None if samples is None else float(samples)


def _distances(rows: Any, where: str) -> Distances:
    between = {}
    for row in rows if isinstance(rows, list) else []:
        between[(str(_need(row, "a", f"{where} [[regions]]", '"eu"')),
                 str(_need(row, "b", f"{where} [[regions]]", '"us"')))] = float(
            _need(row, "latency_ms", f"{where} [[regions]]", "40")) / 1e3
    return Distances(between)


def _table(document: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = document.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: [{key}] must be a table")
    return value


def _need(table: Mapping[str, Any], key: str, where: str, example: str) -> Any:
    if key not in table:
        raise ConfigError(f"{where}: {key} is missing; e.g. {key} = {example}")
    return table[key]
