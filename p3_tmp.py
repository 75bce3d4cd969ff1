import time, torch, cProfile, pstats, io
import torch.distributed as dist
from potluck.bench.ranks import run_ranks
def f(rank, ws):
    from potluck.reducer import Reducer, ReducerConfig
    g = dist.distributed_c10d._get_default_group()
    params = [torch.nn.Parameter(torch.zeros(128)) for _ in range(8)]
    r = Reducer(params, [f"p{i}" for i in range(8)], g, ReducerConfig())
    for p in params: p.grad = torch.ones_like(p)
    flat = torch.ones(1024)
    for _ in range(50): r.reduce_now(); g.allreduce([flat]).wait()
    out = {}
    for name, fn in (("reducer", r.reduce_now), ("raw", lambda: g.allreduce([flat]).wait())):
        g.barrier().wait(); t = time.perf_counter()
        for _ in range(300): fn()
        out[name] = (time.perf_counter() - t) / 300 * 1e3
    pr = cProfile.Profile(); pr.enable()
    for _ in range(300): r.reduce_now()
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    out["prof"] = s.getvalue()
    return out
if __name__ == "__main__":
    r = run_ranks(f, 2)[0]; print(r["reducer"], r["raw"]); print(r["prof"][:3000])
