"""Rank 1 skips backward() and its script ends; rank 0's backward then fails on the
lost peer (PeerLostError). The report must name rank 1, the rank that left."""


import torch

import potluck

torch.set_num_threads(1)
cohort = potluck.init(timeout=60)
model = potluck.DataParallel(torch.nn.Linear(8, 1), group=cohort.group)
loss = model(torch.randn(4, 8)).sum()
cohort.barrier()
if cohort.rank == 1:
    raise SystemExit(0)  # leaves: its script "ends" while rank 0 needs it
loss.backward()
