"""An elastic job whose communication hook has a bug of its own (a RuntimeError, as a
shape mismatch raises): the job must fail at once and say so, not take it for a lost
peer and redo the step until the data cursor refuses."""

import torch

import potluck


def shapes_mismatch(state, bucket):
    raise RuntimeError("The size of tensor a (10) must match the size of tensor b (20)")


torch.set_num_threads(1)
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(*torch.randn(2, 48, 8))
net = torch.nn.Linear(8, 8)
model, opt, loader = potluck.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), data,
                                     global_batch=12, timeout=20, comm_hook=shapes_mismatch)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
opt.finish()
