"""Check that every rank wraps the same model before any gradient is averaged.

Two collectives in the common case (a fixed-size digest per rank); only when digests
differ are the full signatures gathered, so that every rank can raise the same error
naming the first differing parameter and what each side has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

from potluck.collectives import Group, allgather_object, allgather_tensor
from potluck.errors import ModelMismatchError

Entry = tuple[str, str, tuple[int, ...], str]  # (kind, name, shape, dtype)


def model_signature(module: torch.nn.Module) -> list[Entry]:
    """Names, shapes and dtypes of parameters then buffers, in registration order."""
    entries: list[Entry] = []
    for name, param in module.named_parameters():
        kind = "parameter" if param.requires_grad else "frozen parameter"
        entries.append((kind, name, tuple(param.shape), str(param.dtype)))
    for name, buf in module.named_buffers():
        entries.append(("buffer", name, tuple(buf.shape), str(buf.dtype)))
    return entries


def verify_same_model(module: torch.nn.Module, group: Group, device: torch.device) -> None:
    """Raise ModelMismatchError on every rank unless all ranks hold the same model."""
    local = _encode(model_signature(module))
    headers = allgather_tensor(_header(len(local), hashlib.sha256(local).digest(), device),
                               group)
    if all(torch.equal(h, headers[0]) for h in headers):
        return
    signatures = allgather_object(model_signature(module), group, device)
    raise ModelMismatchError(describe_mismatch(signatures))


def describe_mismatch(signatures: list[list[Entry]]) -> str:
    """The message for the first rank whose model differs from rank 0's."""
    reference = signatures[0]
    for rank, other in enumerate(signatures[1:], start=1):
        if other == reference:
            continue
        for position in range(max(len(reference), len(other))):
            mine = reference[position] if position < len(reference) else None
            theirs = other[position] if position < len(other) else None
            if mine != theirs:
                return (
                    f"rank 0 and rank {rank} hold different models; the first difference is "
                    f"entry #{position}: rank 0 has {_show(mine)}, rank {rank} has "
                    f"{_show(theirs)}. Every rank must build the same model (same code, same "
                    "constructor arguments, same dtype) before wrapping it in DataParallel."
                )
    return "ranks disagree on the model signature digest but their signatures are equal"


def _show(entry: Entry | None) -> str:
    if entry is None:
        return "nothing (its model has fewer parameters and buffers)"
    kind, name, shape, dtype = entry
    return f"{kind} {name!r} of shape {list(shape)} and dtype {dtype}"


def _encode(entries: Iterable[Entry]) -> bytes:
    lines = [f"{kind}\t{name}\t{','.join(map(str, shape))}\t{dtype}" for kind, name, shape, dtype
             in entries]
    return "\n".join(lines).encode()


def same_values(tensors: Iterable[torch.Tensor], group: Group, device: torch.device) -> bool:
    """Whether every rank already holds the same values in ``tensors`` (the same model,
    built from the same seed or loaded from the same file), so that rank 0's broadcast
    of them can be left out: over a slow link, a model's worth of bytes. Each rank
    hashes its tensors (SHA-256 of their shapes, dtypes and bytes, one pass at about
    1-2 GB/s) and the digests are all-gathered: one collective on every rank whatever
    the answer, and whatever went wrong in the hashing. Only host tensors of plain
    layout are hashed: on an accelerator the copy to the host would cost more than the
    broadcast it saves, so there (and for quantized or sparse tensors, whose bytes are
    not all of their value) the answer is False and the caller broadcasts."""
    listed = list(tensors)
    checkable = all(t.device.type == "cpu" and t.layout == torch.strided
                    and not t.is_quantized for t in listed)
    digest = hashlib.sha256()
    if checkable:
        try:
            for tensor in listed:
                data = tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
                digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
                digest.update(data.view(torch.uint8).numpy().data)  # (a view: no copy)
        except (RuntimeError, TypeError, ValueError):  # a tensor numpy cannot read
            checkable = False
    headers = allgather_tensor(_header(int(checkable), digest.digest(), device), group)
    return all(bool(h[0]) and torch.equal(h, headers[0]) for h in headers)


def _header(lead: int, digest: bytes, device: torch.device) -> torch.Tensor:
    """``lead`` and a SHA-256 ``digest`` as five int64 words, to all-gather."""
    words = (int.from_bytes(digest[i:i + 8], "little", signed=True) for i in range(0, 32, 8))
    return torch.tensor([lead, *words], dtype=torch.int64, device=device)
