"""The work check's copies in the robust round sum, on 4 Gloo ranks: under a codec they
travel encoded, as they reached their slice's owner, and every member decodes them to
the copies the owner aggregated. So the check's bytes are the codec's, not float32's."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from potluck.testing import run_ranks

NUMEL = 4099  # (not a multiple of the members: the last slice is short)


def _delta(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(NUMEL, generator=gen) * (rank + 1)


def _job(rank: int, world_size: int, wanted: bool) -> dict[str, Any]:
    import torch.distributed as dist

    from potluck.compress import Int8Blockwise, Traffic
    from potluck.sync.round_sum import Piece
    from potluck.trust.aggregate import CenteredClip
    from potluck.trust.round_exchange import RobustRoundSum

    kept: list[torch.Tensor] = []
    traffic = Traffic()

    def keep(piece: Any, owners: tuple[int, ...], targets: tuple[int, ...],
             copies: Any) -> None:
        kept.extend(c.clone() for c in copies)

    exchange = RobustRoundSum(
        CenteredClip(), lambda n: list(range(n)), lambda r: f"m{r}", Int8Blockwise(),
        traffic=traffic, keeper=keep,
        wanted=(lambda piece, owners: owners) if wanted else None)
    piece = Piece(_delta(rank), 0.25, "cpu/float32", 0, 1, (0,),
                  shares=(0.25,) * world_size)
    combined = exchange(piece, dist.group.WORLD).wait()
    return {"kept": kept, "sent": traffic.sent, "combined": combined}


def _owner_copy(sender: int, owners: int) -> torch.Tensor:
    """What the owners decode of ``sender``'s whole delta: each slice encoded alone."""
    from potluck.compress import Int8Blockwise

    codec, flat = Int8Blockwise(), _delta(sender)
    size = math.ceil(NUMEL / owners)
    pieces = [flat[k * size:(k + 1) * size] for k in range(owners)]
    decoded = [codec.decode(codec.encode(torch.cat([p, p.new_zeros(size - p.numel())])),
                            size, torch.float32) for p in pieces]
    return torch.cat(decoded)[:NUMEL]


@pytest.mark.timeout(120)
def test_the_work_checks_copies_travel_encoded_and_decode_as_the_owners_did() -> None:
    from potluck.compress import Int8Blockwise

    plain = run_ranks(_job, 4, False, timeout=90, init_group=True)
    checked = run_ranks(_job, 4, True, timeout=90, init_group=True)
    for result in checked:
        assert len(result["kept"]) == 4
        for sender, copy in enumerate(result["kept"]):
            assert torch.equal(copy, _owner_copy(sender, 4)), sender
    for a, b in zip(plain, checked, strict=True):
        assert torch.equal(a["combined"], b["combined"])  # (the sum is the same)
        assert a["kept"] == []
    # each owner hands every other member 4 encoded lanes more: int8's bytes
    size = math.ceil(NUMEL / 4)
    lane = math.ceil(Int8Blockwise().nbytes(size) / 4) * 4
    extra = [b["sent"] - a["sent"] for a, b in zip(plain, checked, strict=True)]
    assert extra == [3 * 4 * lane] * 4, extra
    assert 3 * 4 * lane < 3 * 4 * size * 4 / 3  # under a third of float32 copies
