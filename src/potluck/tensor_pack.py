"""An object's tensors apart from the rest: one byte buffer, and a small pickle.

Moving a training job's live state (``step.live_state``) by pickling it whole was the
slowest part of admitting a worker: pickle copies every tensor's bytes several times,
and the first unpickling of a tensor in a process costs about 0.2 s of
``torch.serialization`` set-up (a joiner's admission step took 0.4-0.5 s, of which the
broadcast itself was 20-40 ms). ``pack`` instead pickles the object with each plain
dense tensor replaced by a reference (its dtype, shape and offset) and lays the tensors'
bytes end to end in one ``uint8`` tensor, each at a multiple of ``ALIGN`` bytes so that
it can be viewed back as its own dtype; ``unpack`` reverses it. The buffer starts with
the skeleton's length (8 bytes, little-endian) and the skeleton. Other objects, tensor
subclasses (``nn.Parameter``) and tensors that are not plain strided ones (sparse,
quantized) or need gradients go through pickle as before. Tied tensors (one object
twice) come back as one tensor; every unpacked tensor is contiguous, on the CPU, and
owns its memory.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

ALIGN = 16  # bytes: every dtype's element size divides it
_HEADER = 8  # bytes: the skeleton's length


def aligned(size: int) -> int:
    """``size`` rounded up to a multiple of ``ALIGN``."""
    return -(-size // ALIGN) * ALIGN


def packable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` travels as bytes: a plain dense tensor with no autograd."""
    return (type(tensor) is torch.Tensor and tensor.layout == torch.strided
            and not tensor.is_quantized and not tensor.is_nested and not tensor.requires_grad
            and tensor.device.type != "meta")


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._refs: dict[int, tuple[int, int, torch.dtype, tuple[int, ...]]] = {}
        self._size = 0

    def persistent_id(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor) or not packable(obj):
            return None
        ref = self._refs.get(id(obj))
        if ref is None:
            ref = (len(self.tensors), self._size, obj.dtype, tuple(obj.shape))
            self._refs[id(obj)] = ref
            self.tensors.append(obj)
            self._size += aligned(obj.numel() * obj.element_size())
        return ref

    @property
    def size(self) -> int:
        """Bytes the tensors seen so far take, each aligned."""
        return self._size


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, data: torch.Tensor) -> None:
        super().__init__(file)
        self._data = data
        self._made: dict[int, torch.Tensor] = {}

    def persistent_load(self, pid: Any) -> Any:
        index, offset, dtype, shape = pid  # index: an empty tensor shares its offset
        if index not in self._made:
            size = torch.Size(shape).numel() * dtype.itemsize
            view = self._data[offset:offset + size].view(dtype).view(shape)
            self._made[index] = view.clone()
        return self._made[index]


def pack(obj: Any, device: torch.device | None = None) -> torch.Tensor:
    """``obj`` as one ``uint8`` buffer on ``device`` (CPU if None; built on the CPU and
    moved once)."""
    file = io.BytesIO()
    pickler = _Pickler(file)
    pickler.dump(obj)
    skeleton = file.getvalue()
    start = aligned(_HEADER + len(skeleton))
    buffer = torch.zeros(start + pickler.size, dtype=torch.uint8)
    head = len(skeleton).to_bytes(_HEADER, "little") + skeleton
    buffer[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    offset = start
    with torch.no_grad():
        for tensor in pickler.tensors:
            size = tensor.numel() * tensor.element_size()
            # A typed view of the buffer: copy_ takes any strides, conjugate and negative
            # views, and another device.
            buffer[offset:offset + size].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            offset += aligned(size)
    return buffer if device is None else buffer.to(device)


def unpack(buffer: torch.Tensor) -> Any:
    """The object ``pack`` laid out in ``buffer``, its tensors copied to the CPU (one
    copy from another device, then one per tensor)."""
    buffer = buffer.cpu()
    length = int.from_bytes(buffer[:_HEADER].numpy().tobytes(), "little")
    skeleton = buffer[_HEADER:_HEADER + length].numpy().tobytes()
    data = buffer[aligned(_HEADER + length):]
    return _Unpickler(io.BytesIO(skeleton), data).load()
