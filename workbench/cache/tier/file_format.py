"""One KV block as one file: a header that says what the bytes are, then the bytes.

    WBKVBLK1 | header length (4 bytes, little-endian) | header (JSON) | payload

The header carries the tier's fingerprint and, readable by a person, the model, weights digest, dtype, KV format
and block size (`workbench.cache.tier.keys.Fingerprint`); the block's name (its SHA-256 chain digest) and its own
token ids; the payload's length and CRC-32. ``decode`` refuses anything that does not match what the reader
expects — another magic, a truncated payload, another fingerprint (a file of another model or KV format), another
name or tokens, a checksum that does not match — with the reason, so that the tier can skip the file with a
warning instead of ever loading it.
"""

from __future__ import annotations

import json
import struct
import zlib

MAGIC = b"WBKVBLK1"
_LENGTH = struct.Struct("<I")
MAX_HEADER = 1 << 20


class BadBlockFile(ValueError):
    """A block file that must not be loaded; the message says why."""


def encode(fields: dict[str, object], digest: bytes, tokens: tuple[int, ...], payload: bytes) -> bytes:
    header = {**fields, "digest": digest.hex(), "tokens": list(tokens), "payload_bytes": len(payload),
              "crc32": zlib.crc32(payload)}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(raw)) + raw + payload


def decode(data: bytes, *, fingerprint: str, digest: bytes, tokens: tuple[int, ...]) -> memoryview:
    """The payload of a block file, after every check; BadBlockFile says which one failed."""
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or data[:len(MAGIC)] != MAGIC:
        raise BadBlockFile("not a KV block file (wrong magic or shorter than its header)")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if length > MAX_HEADER or start + length > len(data):
        raise BadBlockFile(f"truncated: a {length:,}-byte header in a {len(data):,}-byte file")
    try:
        header = json.loads(data[start:start + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadBlockFile(f"unreadable header ({error})") from None
    if not isinstance(header, dict):
        raise BadBlockFile("unreadable header (not an object)")
    if header.get("fingerprint") != fingerprint:
        raise BadBlockFile(f"foreign: written for {header.get('model')!r}, weights {header.get('weights')!r}, KV "
                           f"{header.get('kv_format')!r}, block size {header.get('block_size')!r} (fingerprint "
                           f"{str(header.get('fingerprint'))[:16]}, this tier's {fingerprint[:16]})")
    if header.get("digest") != digest.hex() or tuple(header.get("tokens", ())) != tuple(tokens):
        raise BadBlockFile("holds another block than its name says (digest or tokens differ)")
    payload = memoryview(data)[start + length:]
    if len(payload) != header.get("payload_bytes"):
        raise BadBlockFile(f"truncated: {len(payload):,} payload bytes of {header.get('payload_bytes')!r}")
    if zlib.crc32(payload) != header.get("crc32"):
        raise BadBlockFile("corrupt: the payload's CRC-32 does not match its header")
    return payload
