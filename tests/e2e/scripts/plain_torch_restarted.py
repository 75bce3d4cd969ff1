"""A plain torch script (env://, the launcher's store) whose rank 1 fails in the first
attempt. The first attempt leaves a key of its own on the store; each attempt says
whether it finds one there before it joins."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                      timedelta(seconds=20))
print(f"attempt {attempt}: an earlier attempt's key: {store.check(['script/attempt0'])}",
      flush=True)
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
store.set("script/attempt0", "here")
total = torch.ones(1)
dist.all_reduce(total)
if attempt == 0 and dist.get_rank() == 1:
    raise RuntimeError("first attempt fails on purpose")
dist.barrier()
print(f"attempt {attempt} done: {total.item():g}", flush=True)
dist.destroy_process_group()
