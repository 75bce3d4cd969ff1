"""The terminal is spared c10d's C++ stack traces (``launch/quiet.py``, pure)."""

from __future__ import annotations

from potluck.launch.quiet import Quieter

# As a worker printed them when node 0, the store's host, was killed (frames cut short).
LINES = b"""\
[W1206 07:29:26.913966922 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl: reset
Exception raised from recvBytes at /__w/c10d/Utils.hpp:784 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7ff761979b8d in libc10.so)
frame #1: <unknown function> + 0x6747a52 (0x7ff753547a52 in libtorch_cpu.so)
<omitting python frames>
frame #21: _start + 0x21 (0x5633ee2b2081 in python)

step abandoned, gradients dropped: bucket 0's all-reduce failed on rank 1
[W1206 07:29:26.949816075 TCPStore.cpp:106] [c10d] sendBytes failed on SocketImpl(fd=3): Broken pipe
Exception raised from sendBytes at /__w/c10d/Utils.hpp:758 (most recent call first):
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7ff761979b8d in libc10.so)
potluck: StoreLostError: the job's store at 127.0.0.1:38835 is gone
frame #0: a line of the user's own that looks like a frame
""".splitlines(keepends=True)


def test_c10d_store_warnings_and_their_cpp_traces_are_left_out_and_nothing_else() -> None:
    quieter = Quieter()
    shown = [line for line in LINES if quieter.shown(line)]
    assert shown == [b"step abandoned, gradients dropped: bucket 0's all-reduce failed on rank 1\n",
                     b"potluck: StoreLostError: the job's store at 127.0.0.1:38835 is gone\n",
                     b"frame #0: a line of the user's own that looks like a frame\n"]
    assert quieter.left_out == len(LINES) - 3


def test_other_cpp_warnings_and_blank_lines_are_shown() -> None:
    quieter = Quieter()
    lines = [b"[W1206 07:29:26.1 ProcessGroupNCCL.cpp:1000] a warning of another kind\n", b"\n",
             b"Traceback (most recent call last):\n"]
    assert [quieter.shown(line) for line in lines] == [True, True, True]
