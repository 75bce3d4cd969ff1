"""potluck's lab: the benchmarks (``potluck bench``), the demos (``potluck demo``) and the
machine shaping they need (CPU quotas, network namespaces).

The lab imports the library; the library never imports the lab. Inside the lab, the
shared modules (``common``, ``driver``, ``jobs``, ``models``, ``text``, ``machine``,
``attacks``, ``elastic_job``) sit below ``bench``, and ``demo`` sits above ``bench``:
the WAN demo runs the WAN bench's jobs.
"""
