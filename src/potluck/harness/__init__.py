"""Test harness, not training API: run a function as N local Gloo ranks (``ranks``), a
small elastic job whose outcome can be checked exactly (``elastic_job``), and a CPU quota
for some processes, a cgroup v1 group of their own (``cpu_quota``). The benches, the
demos and the tests use it."""
