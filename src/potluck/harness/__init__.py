"""Test harness, not training API: run a function as N local Gloo ranks (``ranks``), and a
small elastic job whose outcome can be checked exactly (``elastic_job``). The benches,
the demo's speedup measurement and the tests use it."""
