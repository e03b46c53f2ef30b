#!/usr/bin/env python3
"""Writes fuzz seed inputs derived from the golden iWARP vectors.

usage: fuzz-seeds.py GOLDEN_TXT OUT_DIR

golden.txt holds titled hex dumps ("MPA Request ...", "FPDU ..."). Each fuzz
target gets inputs in its own format (see fuzz/fuzz_targets/*.rs):
  mpa_frame      the MPA frames as they are
  fpdu_deframer  config octet (bit0 CRC, bit1 markers), split octet, FPDUs
  segment        mode octet (0 stream, 1 datagram), then one ULPDU
  datagram       one ULPDU followed by its CRC32C, least-significant octet first
"""
import os
import sys


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def vectors(path):
    title, data = None, bytearray()
    with open(path) as f:
        for line in f:
            if ":" in line and line.startswith("  "):
                data += bytes.fromhex(line.split(":", 1)[1].replace("...", " "))
            elif line.strip():
                if title is not None:
                    yield title, bytes(data)
                title, data = line.strip(), bytearray()
    if title is not None:
        yield title, bytes(data)


def main():
    golden, out = sys.argv[1], sys.argv[2]
    dirs = {t: os.path.join(out, t) for t in ("mpa_frame", "fpdu_deframer", "segment", "datagram")}
    for d in dirs.values():
        os.makedirs(d, exist_ok=True)
    fpdus = []
    for i, (title, data) in enumerate(vectors(golden)):
        if title.startswith("MPA"):
            open(os.path.join(dirs["mpa_frame"], f"golden{i}"), "wb").write(data)
            continue
        ulpdu_len = int.from_bytes(data[:2], "big")
        ulpdu = data[2:2 + ulpdu_len]
        if len(ulpdu) != ulpdu_len:
            continue  # an abbreviated dump; skip it
        fpdus.append(data)
        open(os.path.join(dirs["segment"], f"golden{i}-stream"), "wb").write(b"\x00" + ulpdu)
        open(os.path.join(dirs["segment"], f"golden{i}-dgram"), "wb").write(b"\x01" + ulpdu)
        dgram = ulpdu + crc32c(ulpdu).to_bytes(4, "little")
        open(os.path.join(dirs["datagram"], f"golden{i}"), "wb").write(dgram)
    stream = b"".join(fpdus)
    for split in (1, 7, 64, 255):
        open(os.path.join(dirs["fpdu_deframer"], f"golden-crc-{split}"), "wb").write(bytes([1, split]) + stream)
    print(f"fuzz seeds: {sum(len(os.listdir(d)) for d in dirs.values())} files in {out}")


if __name__ == "__main__":
    main()
