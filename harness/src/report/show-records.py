#!/usr/bin/env python3
"""Prints the perf records a kloop guest sent, from the data.bin run.sh wrote.

Part of a kloop reproducer: it needs only Python 3's standard library, so a
kernel developer can see the records without installing kloop. It reads the
framing (magic KLF1, kind, length, CRC-32), the agent's JSON messages and
the raw perf ring bytes per listener, and decodes PERF_RECORD_KSYMBOL,
PERF_RECORD_BPF_EVENT and PERF_RECORD_LOST from the uapi layout
(include/uapi/linux/perf_event.h). It flags a record whose header.size does
not match its body plus the sample_id trailer the listener asked for. kloop's
own parser is stricter; this is the independent reading.
"""
import json
import struct
import sys
import zlib

MAGIC = b"KLF1"
KIND_MESSAGE, KIND_RECORDS = 1, 2
RECORD_NAMES = {2: "LOST", 17: "KSYMBOL", 18: "BPF_EVENT"}
KSYM_TYPES = {0: "UNKNOWN", 1: "BPF", 2: "OOL"}
BPF_EVENT_TYPES = {0: "UNKNOWN", 1: "PROG_LOAD", 2: "PROG_UNLOAD"}
# sample_id trailer fields in the order the kernel writes them.
TRAILER_BITS = [(1 << 1, "tid"), (1 << 2, "time"), (1 << 6, "id"),
                (1 << 9, "stream_id"), (1 << 7, "cpu"), (1 << 16, "identifier")]


def frames(data):
    pos = 0
    while pos + 16 <= len(data):
        if data[pos:pos + 4] != MAGIC:
            nxt = data.find(MAGIC, pos + 1)
            print(f"!! no frame at offset {pos}; skipping to {nxt}")
            if nxt < 0:
                return
            pos = nxt
            continue
        kind = data[pos + 4]
        length, crc = struct.unpack_from("<II", data, pos + 8)
        payload = data[pos + 16:pos + 16 + length]
        if len(payload) < length:
            print(f"!! frame at offset {pos} is cut short")
            return
        check = zlib.crc32(bytes([kind]) + struct.pack("<I", length) + payload)
        if check != crc:
            print(f"!! frame at offset {pos}: CRC mismatch")
        yield kind, payload
        pos += 16 + length


def trailer_fields(listener):
    if not listener.get("sample_id_all"):
        return []
    st = listener.get("sample_type", 0)
    return [name for bit, name in TRAILER_BITS if st & bit]


def describe(rtype, body):
    if rtype == 17 and len(body) >= 16:
        addr, ln, ktype, flags = struct.unpack_from("<QIHH", body)
        name = body[16:].split(b"\0", 1)[0].decode(errors="replace")
        action = "unregister" if flags & 1 else "register"
        used = 16 + ((len(name.encode()) + 1 + 7) // 8) * 8
        return (f"KSYMBOL {action} {KSYM_TYPES.get(ktype, ktype)} addr={addr:#x} "
                f"len={ln} name={name}"), used
    if rtype == 18 and len(body) >= 16:
        etype, flags, prog_id = struct.unpack_from("<HHI", body)
        tag = body[8:16].hex()
        return f"BPF_EVENT {BPF_EVENT_TYPES.get(etype, etype)} id={prog_id} tag={tag}", 16
    if rtype == 2 and len(body) >= 16:
        ident, lost = struct.unpack_from("<QQ", body)
        return f"LOST id={ident} lost={lost}", 16
    return f"type {rtype} ({len(body)} body bytes)", len(body)


def show_stream(listener, stream):
    fields = trailer_fields(listener)
    trailer_len = 8 * len(fields)
    print(f"listener {listener['index']} (cpu {listener['cpu']}, sample_type "
          f"{listener['sample_type']:#x}, trailer {trailer_len} bytes: "
          f"{', '.join(fields) or 'none'}): {len(stream)} bytes")
    pos, bad = 0, 0
    while pos + 8 <= len(stream):
        rtype, misc, size = struct.unpack_from("<IHH", stream, pos)
        if size < 8 or pos + size > len(stream):
            print(f"  @{pos}: header.size {size} does not fit the stream; stopping")
            return bad + 1
        body = stream[pos + 8:pos + size]
        text, used = describe(rtype, body)
        trailer = body[used:used + trailer_len]
        extra = len(body) - used - trailer_len
        values = []
        for i, name in enumerate(fields):
            if 8 * i + 8 <= len(trailer):
                if name in ("tid", "cpu"):
                    a, b = struct.unpack_from("<II", trailer, 8 * i)
                    values.append(f"{name}={a}/{b}" if name == "tid" else f"cpu={a}")
                else:
                    values.append(f"{name}={struct.unpack_from('<Q', trailer, 8 * i)[0]}")
        line = f"  @{pos}: {text} [{' '.join(values)}]"
        if extra != 0 and rtype in RECORD_NAMES:
            bad += 1
            line += (f"\n    !! header.size is {size}, but the body ends at {8 + used} and "
                     f"the sample_id trailer is {trailer_len} bytes: {extra:+d} bytes "
                     f"unexplained")
        print(line)
        pos += size
    if pos != len(stream):
        print(f"  !! {len(stream) - pos} trailing bytes")
    return bad


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "data.bin"
    data = open(path, "rb").read()
    listeners, chunks = {}, {}
    for kind, payload in frames(data):
        if kind == KIND_MESSAGE:
            msg = json.loads(payload)
            what = msg.get("msg")
            if what == "listener":
                listeners[msg["index"]] = msg
            elif what == "step-start":
                print(f"step {msg['index']}: {msg['what']}")
            elif what in ("agent-error", "unsupported", "log"):
                print(f"agent {what}: {json.dumps(msg)}")
            elif what == "done":
                print(f"agent done: {msg.get('records_bytes')} record bytes")
        elif kind == KIND_RECORDS and len(payload) >= 12:
            index, offset = struct.unpack_from("<IQ", payload)
            chunks.setdefault(index, []).append((offset, payload[12:]))
    bad = 0
    for index in sorted(chunks):
        stream = b"".join(c for _, c in sorted(chunks[index]))
        listener = listeners.get(index, {"index": index, "cpu": "?", "sample_type": 0})
        bad += show_stream(listener, stream)
    print(f"{bad} malformed record(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
