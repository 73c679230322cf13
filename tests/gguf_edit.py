"""A real GGUF model with one metadata value replaced by raw bytes: a hostile header (a count of 2^40, a string where a
number belongs, an array that claims 2^62 elements) on an otherwise loadable model from fixtures/models/.

Written from the GGUF format (ggml/docs/gguf.md), independently of attncheck's reader: magic, version, tensor count,
KV count; KV pairs (key string, value type, value); tensor infos; data aligned to general.alignment. The data section
is copied as it was, re-aligned after the edited header (its offsets are relative to its start).
"""
from __future__ import annotations

import struct
from pathlib import Path

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type → bytes
STRING, ARRAY = 8, 9
U32, I32, F32, BOOL, U64 = 4, 5, 6, 7, 10


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def string(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def value(vtype: int, v) -> tuple[int, bytes]:
    """(type, bytes) of a scalar or a string, as an edit takes it."""
    if vtype == STRING:
        return STRING, string(v)
    fmt = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}[vtype]
    return vtype, struct.pack(fmt, v)


def array(etype: int, claimed: int, payload: bytes = b"") -> tuple[int, bytes]:
    """An array that says it holds `claimed` elements of etype, followed by `payload` (as many bytes as it has)."""
    return ARRAY, struct.pack("<I", etype) + u64(claimed) + payload


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in SCALAR:
        return pos + SCALAR[vtype]
    if vtype == STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    etype, n = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    for _ in range(n):
        pos = _skip_value(buf, pos, etype)
    return pos


def edit(src: Path, dst: Path, changes: dict[str, tuple[int, bytes] | None], version: int | None = None) -> Path:
    """Copy src to dst with the values of `changes` (key → (type, raw value bytes), or None to drop the key; a key
    src lacks is added)."""
    buf = src.read_bytes()
    magic, ver, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
    pos, kvs, align = 24, [], 32
    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen].decode()
        vtype = struct.unpack_from("<I", buf, pos + 8 + klen)[0]
        start = pos + 12 + klen
        end = _skip_value(buf, start, vtype)
        if key == "general.alignment":
            align = struct.unpack_from("<I", buf, start)[0]
        kvs.append((key, vtype, buf[start:end]))
        pos = end
    infos_start = pos
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", buf, pos)[0]
        pos += 8 + nlen
        n_dims = struct.unpack_from("<I", buf, pos)[0]
        pos += 4 + 8 * n_dims + 4 + 8
    infos = buf[infos_start:pos]
    data = buf[(pos + align - 1) // align * align:]
    out = []
    seen = set()
    for key, vtype, raw in kvs:
        seen.add(key)
        if key in changes:
            if changes[key] is None:
                continue
            vtype, raw = changes[key]
        out.append(string(key) + struct.pack("<I", vtype) + raw)
    for key, change in changes.items():
        if key not in seen and change is not None:
            out.append(string(key) + struct.pack("<I", change[0]) + change[1])
    head = struct.pack("<4sIQQ", magic, ver if version is None else version, n_tensors, len(out)) + b"".join(out)
    head += infos
    new_align = align
    if "general.alignment" in changes and changes["general.alignment"] is not None:
        a = changes["general.alignment"]
        new_align = struct.unpack("<I", a[1])[0] if a[0] == U32 and len(a[1]) == 4 and struct.unpack("<I", a[1])[0] \
            else align
    head += b"\0" * ((-len(head)) % new_align)
    dst.write_bytes(head + data)
    return dst


def copy_model(src: Path, dst: Path, value=lambda name, v: v, data=lambda name, d: d) -> Path:
    """A copy of a real model through the gguf package, each metadata value through value(name, v) and each
    tensor's stored data through data(name, d)."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst), arch=reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, value(field.name, field.contents()), kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(data(t.name, t.data), tensor_endianess=reader.endianess)
    writer.close()
    return dst


def rolled_embeddings(src: Path, dst: Path) -> Path:
    """A copy of a real model whose embedding table is rolled by one row (token i gets token i-1's row): another
    model of exactly the same shapes and header, for what a dump of the original must not pass as."""
    import numpy as np

    return copy_model(src, dst, data=lambda name, d: np.roll(d, 1, axis=0) if name == "token_embd.weight" else d)
