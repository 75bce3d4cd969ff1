"""Rank 1 skips backward() after step 0, and its script ends as a README loop does,
with ``cohort.close()``; rank 0's backward then fails on the lost peer
(PeerLostError). The report must name rank 1, the rank that left."""

import torch

import potluck

torch.set_num_threads(1)
cohort = potluck.init(timeout=60)
model = potluck.DataParallel(torch.nn.Linear(8, 1), group=cohort.group)
for step in range(2):
    loss = model(torch.randn(4, 8)).sum()
    if cohort.rank == 1 and step == 1:
        break  # leaves: skips this step's backward() while rank 0 needs it
    loss.backward()
cohort.close()
