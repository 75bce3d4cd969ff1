"""Gradient synchronization: buckets, the reducer, communication hooks, DataParallel."""

from potluck.reducer.buckets import assign_buckets
from potluck.reducer.data_parallel import DataParallel
from potluck.reducer.hooks import Bucket, CommHook, allreduce_mean, weighted_mean
from potluck.reducer.reducer import Reducer, ReducerConfig

__all__ = [
    "Bucket",
    "CommHook",
    "DataParallel",
    "Reducer",
    "ReducerConfig",
    "allreduce_mean",
    "assign_buckets",
    "weighted_mean",
]
