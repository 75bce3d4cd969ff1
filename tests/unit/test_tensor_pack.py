"""An object's tensors travel as raw bytes beside a small pickle, and come back equal."""

from __future__ import annotations

import torch
from torch import nn

from potluck.tensor_pack import ALIGN, aligned, pack, unpack


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    dense = torch.empty(tensor.shape, dtype=tensor.dtype)  # unit strides, whatever it had
    dense.copy_(tensor)
    return dense.reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


def test_a_live_state_comes_back_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    state = {
        "model": {"w": torch.randn(3, 5, generator=gen), "b": torch.randn(3, generator=gen)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.randn(7, generator=gen)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
        "odd": [torch.tensor([True, False, True]), torch.arange(5, dtype=torch.int16),
                torch.randn(3, generator=gen).to(torch.bfloat16),
                torch.randn(2, dtype=torch.complex64, generator=gen),
                torch.tensor(2.5, dtype=torch.float64), torch.zeros(0, 4),
                wide.t(),  # not contiguous
                torch.tensor([-0.0, float("nan"), float("inf")])],
        "steps": 12, "name": "x", "pair": (1, 2.0),
    }
    back = unpack(pack(state))
    assert back["steps"] == 12 and back["name"] == "x" and back["pair"] == (1, 2.0)
    assert back["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
    assert _same(back["model"]["w"], state["model"]["w"])
    assert _same(back["model"]["b"], state["model"]["b"])
    assert _same(back["optimizer"]["state"][0]["momentum_buffer"],
                 state["optimizer"]["state"][0]["momentum_buffer"])
    for got, sent in zip(back["odd"], state["odd"], strict=True):
        assert _same(got, sent.contiguous()), (got, sent)
    assert back["odd"][6].is_contiguous() and torch.equal(back["odd"][6], wide.t())


def test_every_tensor_starts_aligned_and_owns_its_memory() -> None:
    state = {"a": torch.ones(3, dtype=torch.uint8), "b": torch.full((3,), 7.0,
                                                                      dtype=torch.float64)}
    buffer = pack(state)
    back = unpack(buffer)
    assert back["b"].storage_offset() == 0  # a copy, not a view into the buffer
    buffer.zero_()
    assert torch.equal(back["b"], state["b"]) and torch.equal(back["a"], state["a"])
    assert aligned(1) == ALIGN and aligned(ALIGN) == ALIGN and aligned(0) == 0
    assert buffer.numel() % ALIGN == 0


def test_the_bytes_travel_outside_the_pickle() -> None:
    big = torch.randn(100_000)
    buffer = pack({"big": big})
    skeleton = int.from_bytes(buffer[:8].numpy().tobytes(), "little")
    assert skeleton < 1000  # the 400 kB are not pickled
    assert buffer.numel() == aligned(8 + skeleton) + 400_000


def test_one_tensor_twice_is_sent_once_and_comes_back_tied() -> None:
    shared = torch.randn(1000)
    buffer = pack({"a": shared, "b": shared})
    assert buffer.numel() < 8000
    back = unpack(buffer)
    assert back["a"] is back["b"] and torch.equal(back["a"], shared)


def test_what_is_not_a_plain_tensor_goes_through_pickle() -> None:
    param = nn.Parameter(torch.randn(3))
    needs_grad = torch.randn(2, requires_grad=True)
    sparse = torch.randn(3, 3).to_sparse()
    back = unpack(pack({"param": param, "grad": needs_grad, "sparse": sparse}))
    assert isinstance(back["param"], nn.Parameter) and torch.equal(back["param"], param)
    assert back["grad"].requires_grad and torch.equal(back["grad"], needs_grad)
    assert back["sparse"].is_sparse and torch.equal(back["sparse"].to_dense(),
                                                    sparse.to_dense())


def test_an_object_without_tensors() -> None:
    assert unpack(pack(None)) is None
    assert unpack(pack({"k": [1, "two", 3.0]})) == {"k": [1, "two", 3.0]}


def test_views_with_any_strides_conjugates_and_narrow_dtypes() -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(3, 4, generator=gen)
    complex_ = torch.randn(3, dtype=torch.complex64, generator=gen)
    state = {
        "one_strided": base[:, 1][0:1],  # one element, stride 4: contiguous() keeps it
        "empty_strided": torch.empty(0, 3)[:, 1],
        "column": base[:, 2],
        "conj": complex_.conj(),  # a conjugate view (the bit, not the values)
        "neg": torch._neg_view(base[0]),
        "fp8": torch.randn(5, generator=gen).to(torch.float8_e4m3fn),
        "expanded": torch.tensor([1.5]).expand(4),
    }
    back = unpack(pack(state))
    for name, sent in state.items():
        assert _same(back[name], sent.resolve_conj().resolve_neg()), name
    assert torch.equal(back["conj"], complex_.conj())


def test_nested_tensors_go_through_pickle() -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    back = unpack(pack({"n": nested}))
    assert back["n"].is_nested
    assert [t.tolist() for t in back["n"].unbind()] == [[1.0, 1.0], [1.0, 1.0, 1.0]]
