"""Error feedback: what a lossy codec dropped this time is added to what is sent next
time, so nothing is lost, only delayed (Seide et al. 2014; Karimireddy et al. 2019).

Before encoding ``x`` under ``key`` the residual ``e`` is added (``y = x + e``); after,
the new residual is ``y - decode(encode(y))``. One residual per key (a bucket, a
fragment, a slice a rank owns); it is state: checkpoints and joiners carry it.
"""

from __future__ import annotations

from typing import Any

import torch


class ErrorFeedback:
    """Residuals by key; ``compensate`` before encoding, ``remember`` after."""

    def __init__(self) -> None:
        self._residuals: dict[str, torch.Tensor] = {}

    def compensate(self, key: str, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` plus the residual kept under ``key`` (a new tensor; ``flat`` is left
        alone). A residual of another size (the buckets were rebuilt) is dropped."""
        residual = self._residuals.get(key)
        if residual is None or residual.numel() != flat.numel():
            return flat.clone()
        return flat + residual.to(flat)  # the tensor's dtype and device (a resumed GPU run)

    def remember(self, key: str, sent: torch.Tensor, decoded: torch.Tensor) -> None:
        """What ``decoded`` (the codec's round trip of ``sent``) left out, for next time."""
        self._residuals[key] = (sent - decoded).detach()

    def residual(self, key: str) -> torch.Tensor | None:
        return self._residuals.get(key)

    def forget(self, key: str) -> None:
        """Drop the residual kept under ``key`` (one that is not finite, say)."""
        self._residuals.pop(key, None)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """The residuals as they are (no copy: ``remember`` replaces, never changes one),
        for ``restore`` after an attempt whose payload never arrived."""
        return dict(self._residuals)

    def restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        self._residuals = dict(snapshot)

    def clear(self) -> None:
        self._residuals.clear()

    def state_dict(self) -> dict[str, Any]:
        return {key: value.cpu() for key, value in self._residuals.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._residuals = {str(key): torch.as_tensor(value) for key, value in state.items()}
