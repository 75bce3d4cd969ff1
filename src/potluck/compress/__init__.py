"""Codecs on the wire: what a gradient bucket or a pseudo-gradient looks like in flight.

``codec.py`` (the protocol), ``casts.py`` (fp16, bf16), ``int8.py`` and ``int4.py``
(blockwise int8 and int4, on ``blockwise.py``),
``topk.py`` (sparse top-k), ``feedback.py`` (error feedback), ``exchange.py`` (the sum
across ranks: all-reduce, all-gather or scatter, by the codec's flags), ``hook.py``
(``CompressedSum``, a communication hook for every-step sync).
"""

from potluck.compress.casts import Bf16, Cast, Fp16
from potluck.compress.codec import Bounded, Codec, Identity
from potluck.compress.exchange import Traffic, reduce_sum, route, sent_bytes, start_sum
from potluck.compress.feedback import ErrorFeedback
from potluck.compress.hook import CompressedSum
from potluck.compress.int4 import Int4Blockwise
from potluck.compress.int8 import Int8Blockwise
from potluck.compress.topk import TopK

__all__ = [
    "Bf16", "Bounded", "Cast", "Codec", "CompressedSum", "ErrorFeedback", "Fp16", "Identity",
    "Int4Blockwise", "Int8Blockwise", "TopK", "Traffic", "reduce_sum", "route", "sent_bytes",
    "start_sum",
]
