"""Two hosts, one job: ``potluck run --nnodes 2`` across two network namespaces.

Each namespace is a host with its own address on a veth pair (10.231.x.1 and .2). Node 0
hosts the store; node 1 reaches it over the veth. The final parameters must equal those
of one host running both workers on the same global batch. Needs root and ``ip netns``;
skipped otherwise. The namespaces are deleted whatever happens.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from potluck.testing import free_port
from tests.e2e.helpers import EXAMPLE, ROOT, kill_leftovers, potluck_run


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def hosts() -> Iterator[tuple[tuple[str, str], tuple[str, str]]]:
    """Two namespaces joined by a veth pair: ((name, address), (name, address))."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 (`ip netns`) to build two hosts")
    tag = f"{os.getpid() % 10000}-{random.randrange(10000)}"
    subnet = random.randrange(1, 250)
    names = (f"pl-a-{tag}", f"pl-b-{tag}")
    addrs = (f"10.231.{subnet}.1", f"10.231.{subnet}.2")
    veth = (f"pla{tag}"[:15], f"plb{tag}"[:15])
    created: list[str] = []
    try:
        for name in names:
            try:
                _ip("netns", "add", name)
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot create a network namespace: {exc.stderr.strip()}")
            created.append(name)
        _ip("link", "add", veth[0], "netns", names[0], "type", "veth",
            "peer", "name", veth[1], "netns", names[1])
        for name, dev, addr in zip(names, veth, addrs, strict=True):
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", name, "link", "set", dev, "up")
        yield (names[0], addrs[0]), (names[1], addrs[1])
    finally:
        for name in created:  # deleting a namespace also deletes its end of the veth
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@pytest.mark.timeout(180)
def test_two_hosts_equal_one_host(
    hosts: tuple[tuple[str, str], tuple[str, str]], tmp_path: Path
) -> None:
    (ns_a, addr_a), (ns_b, _) = hosts
    port = str(free_port())
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", addr_a,
              "--master-port", port, "--join-timeout", "60", "--run-id", "multihost"]
    nodes = [
        subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "potluck", "run", *common,
             "--node-rank", str(rank), str(EXAMPLE), "--out", str(tmp_path / "two.pt")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )
        for rank, ns in enumerate((ns_a, ns_b))
    ]
    try:
        outputs = [node.communicate(timeout=120) for node in nodes]
    finally:
        kill_leftovers(nodes)
    codes = [node.returncode for node in nodes]
    assert codes == [0, 0], "\n".join(  # both nodes' output: one's failure explains the other's
        f"--- node {rank}: exit {code}\n{out}\n{err}"
        for rank, (code, (out, err)) in enumerate(zip(codes, outputs, strict=True)))
    assert "on 2 rank(s)" in outputs[0][0]

    one = potluck_run("--nproc-per-node", "2", str(EXAMPLE), "--out", str(tmp_path / "one.pt"))
    assert one.returncode == 0, one.stderr
    two, single = torch.load(tmp_path / "two.pt"), torch.load(tmp_path / "one.pt")
    assert two.keys() == single.keys()
    for key in two:
        assert torch.allclose(two[key], single[key], atol=1e-6), key
