"""A script written for torchrun: the default process group from env:// and torch DDP."""

import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print(f"sum {value.item():g} world {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
