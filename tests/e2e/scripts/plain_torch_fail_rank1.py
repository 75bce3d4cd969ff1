"""A plain torch.distributed script (no potluck): rank 1 raises after the first
all-reduce; rank 0 would wait in the next one."""

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
if dist.get_rank() == 1:
    raise ValueError("rank one exploded on purpose")
dist.all_reduce(value)
