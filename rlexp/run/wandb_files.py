"""W&B runs on disk: where a member's runs are, and what a run's transaction log (``run-<id>.wandb``) holds.

wandb ships no Python reader of its transaction log, so this reads its documented LevelDB-log layout:
a 7-byte file header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of records, each with a
7-byte header (crc32, length, type FULL/FIRST/MIDDLE/LAST) and a serialized ``wandb_internal_pb2.Record``
as payload. A run that ended (``run.finish``) has an ``exit`` record.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

_BLOCK, _HEADER = 32768, 7
OFFLINE_RUNS = "offline-run-*"  # an offline run's dir under seed_<k>/wandb/ (the documented sync glob's last part)
ONLINE_RUNS = "run-*"


def run_dirs(member_dir: Path) -> list[Path]:
    """The W&B run dirs of a member (``seed_<k>/wandb/offline-run-*`` and ``run-*``), oldest first."""
    wandb_dir = member_dir / "wandb"
    runs = [*wandb_dir.glob(OFFLINE_RUNS), *wandb_dir.glob(ONLINE_RUNS)]
    return sorted((p for p in runs if p.is_dir() and not p.is_symlink()), key=lambda p: p.name.split("run-", 1)[1])


def read_payloads(path: Path) -> list[bytes]:
    """The records' payloads in a W&B transaction log, in order; ValueError when the file is not one or
    a record's checksum fails. A log cut off mid-record ends at its last whole record."""
    data = path.read_bytes()
    if len(data) < _HEADER or struct.unpack("<4sHB", data[:_HEADER]) != (b":W&B", 0xBEE1, 0):
        raise ValueError("not a W&B transaction log")
    payloads, pending, pos = [], b"", _HEADER
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # block trailer: zero padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if crc == length == kind == 0:  # zero padding up to the next block
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        if len(chunk) < length:  # cut off (a killed writer)
            break
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad checksum at byte {pos}")
        pos += _HEADER + length
        if kind == 1:
            payloads.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            payloads.append(pending + chunk)
            pending = b""
        else:
            raise ValueError(f"unknown record type {kind} at byte {pos}")
    return payloads


def read_records(path: Path) -> list[Any]:
    """Every record of a W&B transaction log, as ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for payload in read_payloads(path):
        record = pb.Record()
        record.ParseFromString(payload)
        records.append(record)
    return records


def exit_code(run_dir: Path) -> tuple[int | None, str | None]:
    """(the exit code a W&B run ended with, None), or (None, what is wrong): no or several ``.wandb``
    files, not readable as one, no exit record (the run never finished)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    files = sorted(run_dir.glob("run-*.wandb"))
    if len(files) != 1:
        return None, f"{len(files)} run-*.wandb files, expected 1"
    try:
        payloads = read_payloads(files[0])
    except (OSError, ValueError) as exc:
        return None, f"{files[0].name}: {exc}"
    for payload in reversed(payloads):  # the exit record is near the end
        record = pb.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError:
            return None, f"{files[0].name}: a record that is not a W&B record"
        if record.WhichOneof("record_type") == "exit":
            return record.exit.exit_code, None
    return None, "no exit record (the run never finished)"
