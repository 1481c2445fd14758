"""Readers and writers of a store's files for the tests that inspect or craft them: the log chain
(``csrc/include/memkern/log_codec.h``) and the format-3 snapshot (``snapshot.h``: records.bin
manifest, pack files of namespace blobs, graph files). Crafting keeps every checksum valid, so
what a test corrupts reaches the store's structural checks."""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

HEADER = 44


def log_format(data: bytes) -> int:
    return struct.unpack_from("<I", data, 8)[0]


def entry_header_size(fmt: int) -> int:
    return 20 if fmt >= 3 else 12


def log_entries(f: Path) -> list[tuple[int, int, int]]:
    """(offset, header size, payload length) of every entry of one log file; asserts that they are
    intact and back to back up to the end of the file (no garbage left by a failed write)."""
    data = Path(f).read_bytes()
    fmt = log_format(data)
    hs = entry_header_size(fmt)
    off, out = HEADER, []
    while off < len(data):
        ln, pcrc = struct.unpack_from("<II", data, off)
        (hcrc,) = struct.unpack_from("<I", data, off + hs - 4)
        assert zlib.crc32(data[off:off + hs - 4]) == hcrc, f"bad entry header at {off}"
        assert off + hs + ln <= len(data) and zlib.crc32(data[off + hs:off + hs + ln]) == pcrc, f"bad entry at {off}"
        out.append((off, hs, ln))
        off += hs + ln
    return out


def chain(store: Path) -> list[Path]:
    """The store's log files, oldest generation first."""
    files = [p for p in Path(store).iterdir() if p.name == "wal.log" or (p.name.startswith("wal-") and p.suffix == ".log")]
    return sorted(files, key=lambda p: struct.unpack_from("<Q", p.read_bytes(), 24)[0])


def entry_count(store: Path) -> int:
    return sum(len(log_entries(f)) for f in chain(store))


def snapshot_dir(store: Path) -> Path:
    gen = struct.unpack_from("<Q", (Path(store) / "CURRENT").read_bytes(), 12)[0]
    return Path(store) / f"snap-{gen}"


# ----------------------------------------------------------------------------- records.bin (format 3)


class _R:
    def __init__(self, b: bytes, off: int = 0):
        self.b, self.o = b, off

    def take(self, fmt: str):
        v = struct.unpack_from(fmt, self.b, self.o)
        self.o += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def str(self) -> bytes:
        n = self.take("<Q")
        s = self.b[self.o:self.o + n]
        self.o += n
        return s


@dataclass
class Blob:
    name: str
    pack: int
    offset: int
    length: int
    crc: int


@dataclass
class Manifest:
    params: tuple
    packs: list[tuple[int, int]]
    blobs: list[Blob]
    tombstones: list[int] = field(default_factory=list)


def read_manifest(snap: Path) -> Manifest:
    data = (Path(snap) / "records.bin").read_bytes()
    assert data[:8] == b"MKSNAP\0\0" and struct.unpack_from("<I", data, 8)[0] == 3
    r = _R(data, 20)
    params = r.take("<IIIIq")
    packs = [r.take("<QQ") for _ in range(r.take("<Q"))]
    blobs = []
    for _ in range(r.take("<Q")):
        name = r.str().decode()
        blobs.append(Blob(name, *r.take("<QQQI")))
    tomb = [r.take("<q") for _ in range(r.take("<Q"))]
    assert r.o == len(data) - 4
    return Manifest(params, [tuple(p) for p in packs], blobs, tomb)


def write_manifest(snap: Path, m: Manifest) -> None:
    b = bytearray(struct.pack("<IIIIq", *m.params))
    b += struct.pack("<Q", len(m.packs))
    for p in m.packs:
        b += struct.pack("<QQ", *p)
    b += struct.pack("<Q", len(m.blobs))
    for x in m.blobs:
        nm = x.name.encode()
        b += struct.pack("<Q", len(nm)) + nm + struct.pack("<QQQI", x.pack, x.offset, x.length, x.crc)
    b += struct.pack("<Q", len(m.tombstones)) + b"".join(struct.pack("<q", t) for t in m.tombstones)
    f = bytearray(b"MKSNAP\0\0") + struct.pack("<IQ", 3, len(b)) + b
    f += struct.pack("<I", zlib.crc32(bytes(f)))
    (Path(snap) / "records.bin").write_bytes(bytes(f))


def blob_levels(blob: bytes, dim: int) -> list[tuple[int, int, int, object]]:
    """Per level (topic, turn) of a namespace blob: (kind, offset of its data in the blob, its
    length, detail): kind 1 flat (detail: row count), kind 2 hnsw (detail: (file name, offset of
    its u64 size + u32 crc))."""
    r = _R(blob)
    for _ in range(r.take("<Q")):
        r.take("<qIBqBIBdd")
        for _ in range(4):
            r.str()
        r.take("<d")
        for _ in range(r.take("<Q")):
            r.take("<I")
            for _ in range(3):
                r.str()
            nf = r.take("<Q")  # (not `r.o += 4 * r.take(...)`: that reads r.o before take moves it)
            r.o += 4 * nf
            r.take("<dB")
        nc = r.take("<Q")
        r.o += 8 * nc
    nt = r.take("<Q")
    r.o += 8 * nt
    out = []
    for _ in range(2):
        kind = r.take("<B")
        start = r.o
        if kind == 1:
            n = r.take("<Q")
            r.o += n * (8 + 4 * dim)
            out.append((1, start, r.o - start, n))
        elif kind == 2:
            name = r.str().decode()
            at = r.o
            r.take("<QI")
            out.append((2, start, r.o - start, (name, at)))
        else:
            out.append((0, start, 0, None))
    assert r.o == len(blob)
    return out


def blob_bytes(snap: Path, b: Blob) -> bytes:
    data = (Path(snap) / f"pack-{b.pack}.bin").read_bytes()
    return data[b.offset:b.offset + b.length]


def replace_blob(snap: Path, m: Manifest, i: int, new: bytes) -> None:
    """Puts namespace i's blob `new` at the end of its pack and points the manifest at it (valid
    checksums)."""
    b = m.blobs[i]
    pf = Path(snap) / f"pack-{b.pack}.bin"
    data = bytearray(pf.read_bytes())
    b.offset, b.length, b.crc = len(data), len(new), zlib.crc32(new)
    data += new
    pf.write_bytes(bytes(data))
    m.packs = [(p, len(data) if p == b.pack else s) for p, s in m.packs]
    write_manifest(snap, m)


def set_graph(store: Path, name: str, data: bytes) -> None:
    """Replaces graph file `name` of the live snapshot and makes the size + CRC its namespace blob
    records (and the blob's and the manifest's own CRCs) match, as a crafted store would."""
    snap = snapshot_dir(store)
    m = read_manifest(snap)
    dim = m.params[0]
    for i, b in enumerate(m.blobs):
        blob = bytearray(blob_bytes(snap, b))
        for kind, _, _, detail in blob_levels(bytes(blob), dim):
            if kind == 2 and detail[0] == name:
                (snap / name).write_bytes(data)
                struct.pack_into("<QI", blob, detail[1], len(data), zlib.crc32(data))
                replace_blob(snap, m, i, bytes(blob))
                return
    raise AssertionError(f"no graph file {name} in {snap}")


def patch_flat(store: Path, ns: int, level: int, mutate) -> None:
    """Rewrites the flat level of namespace `ns`'s blob (u64 n, labels, vectors) with
    mutate(bytearray) -> bytes, with valid checksums."""
    snap = snapshot_dir(store)
    m = read_manifest(snap)
    blob = blob_bytes(snap, m.blobs[ns])
    kind, start, length, _ = blob_levels(blob, m.params[0])[level]
    assert kind == 1, kind
    new = blob[:start] + bytes(mutate(bytearray(blob[start:start + length]))) + blob[start + length:]
    replace_blob(snap, m, ns, new)
