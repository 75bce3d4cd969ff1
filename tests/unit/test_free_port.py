"""``potluck.testing.free_port``: a port is handed out once in a process, so two picked
in a row are two (the kernel may give a just-closed probe's port to the next probe)."""

from __future__ import annotations

from potluck.testing import free_port


def test_ports_picked_in_a_row_are_all_different() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p <= 65535 for p in ports)
