"""Protobuf wire-format encoding by hand: the few pieces a trace writer needs, fast.

A field is a tag ``varint(number << 3 | wire_type)`` followed by its value::

    wire type 0 (varint):  08 96 01              field 1 = 150
    wire type 1 (64-bit):  29 <8 bytes LE>        field 5 = a double / fixed64
    wire type 2 (bytes):   12 03 61 62 63         field 2 = "abc" (length, then the bytes)

Varints are little-endian groups of 7 bits, the high bit set on every byte but the last. Negative
``int64`` values are written as their 64-bit two's complement (10 bytes).
"""

from __future__ import annotations

import struct

LEN = 2  # the wire type of a length-delimited field
MASK64 = (1 << 64) - 1

SMALL = 1 << 14
# Whole varints of 0 .. 16383 (one or two bytes), looked up rather than computed.
VARINTS: list[bytes] = [bytes((v,)) if v < 0x80 else bytes(((v & 0x7F) | 0x80, v >> 7)) for v in range(SMALL)]
# 14 bits as two varint bytes with the continuation bit set on both: a piece of a longer varint. A 64-bit
# timestamp's varint is GROUPS14[low & 0x3FFF] + GROUPS14[(low >> 14) & 0x3FFF] + varint(value >> 28).
GROUPS14: list[bytes] = [bytes(((v & 0x7F) | 0x80, (v >> 7) | 0x80)) for v in range(SMALL)]

pack_double = struct.Struct("<d").pack  # the 8 bytes of a double field's value (wire type 1)


def varint(value: int) -> bytes:
    """Unsigned varint of ``value`` (negative ints as 64-bit two's complement, like int64 fields)."""
    if 0 <= value < SMALL:
        return VARINTS[value]
    if value < 0:
        value &= MASK64
    out = b""
    while value >= SMALL:  # 14 bits at a time from the tables
        out += GROUPS14[value & 0x3FFF]
        value >>= 14
    return out + VARINTS[value]


def field_varint(number: int, value: int) -> bytes:
    """A varint field (int32/int64/uint64/bool/enum)."""
    return varint(number << 3) + varint(value)


def field_bytes(number: int, data: bytes) -> bytes:
    """A length-delimited field: bytes, a string already encoded, or an embedded message."""
    return varint(number << 3 | LEN) + varint(len(data)) + data


def field_string(number: int, text: str) -> bytes:
    return field_bytes(number, text.encode("utf-8", "replace"))
