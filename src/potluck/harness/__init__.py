"""Test harness, not training API: run a function as N local Gloo ranks (``ranks``)."""
