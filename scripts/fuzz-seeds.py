#!/usr/bin/env python3
"""Writes fuzz seed inputs derived from the golden iWARP vectors.

usage: fuzz-seeds.py GOLDEN_TXT OUT_DIR

golden.txt holds titled hex dumps ("MPA Request ...", "FPDU ..."). Each fuzz
target gets inputs in its own format (see fuzz/fuzz_targets/*.rs):
  mpa_frame      the MPA frames as they are
  fpdu_deframer  config octet (bit0 CRC, bit1 markers), split octet, FPDUs
  segment        mode octet (0 stream, 1 datagram), then one ULPDU
  datagram       one ULPDU followed by its CRC32C, least-significant octet first
  dc_table       a config octet, then operations on the DC connection table
                 (not from the vectors: a few hand-made sequences)
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


def dc_table_seeds():
    """Operation sequences for fuzz/fuzz_targets/dc_table.rs (its opcodes)."""
    post = bytes([0, 0, 0, 0, 0])  # to source 0, first DCT, its key
    later = bytes([3, 40])  # 16 ms pass
    # A message from the peer, answering with what the table sent: an
    # Accept (kind 1) naming our connection id and a cookie of ours.
    def message(kind, local):
        return bytes([1, 0, kind, 0, 0x1B, 0x58, 0]) + bytes(8) + bytes([0, 0]) + bytes(8) + bytes([0, local])
    invite = bytes([1, 3, 0, 0, 0, 0, 0]) + bytes(7) + b"\x05" + bytes([0]) + bytes(7) + b"\x03" + bytes([1])
    return {
        "post-accept-connect": bytes([0]) + post + later + message(1, 0) + bytes([4, 0, 0]) + later * 3,
        "direct-post-close": bytes([1]) + post + bytes([4, 0, 0, 5, 0, 1, 5, 0, 0]) + later,
        "invite-attach-offer": bytes([2]) + invite + bytes([6, 0, 0, 0, 8, 0, 3, 10, 0]) + later,
        "raw-and-dcts": bytes([0, 2, 0, 0, 40]) + b"sDC1" + bytes(36) + bytes([11, 0, 0, 11, 0, 1]) + later,
    }


def main():
    golden, out = sys.argv[1], sys.argv[2]
    dirs = {t: os.path.join(out, t) for t in ("mpa_frame", "fpdu_deframer", "segment", "datagram", "dc_table")}
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
    for name, ops in dc_table_seeds().items():
        open(os.path.join(dirs["dc_table"], name), "wb").write(ops)
    print(f"fuzz seeds: {sum(len(os.listdir(d)) for d in dirs.values())} files in {out}")


if __name__ == "__main__":
    main()
