"""Perfetto's protobuf trace format, written from our Chrome JSON trace with the ``perfetto``
package's trace builder (an optional extra: ``pip install 'trn2core[perfetto]'``).

What it adds over the JSON: each track is a named child of its process (no fake thread ids),
slice arguments are typed debug annotations, counters are real counter tracks, and flows are
attached to the slices they join (``flow_ids`` / ``terminating_flow_ids``) instead of being
bound by timestamp. Times are whole nanoseconds (the JSON has picoseconds); a slice shorter
than that is written as an instant.
"""

from __future__ import annotations

import bisect
from typing import Any

from .errors import Trn2ValueError

#: File suffixes ``save_trace`` writes as Perfetto protobuf.
PROTOBUF_SUFFIXES = (".pftrace", ".perfetto-trace")

_SEQUENCE = 1  # one trusted packet sequence: every packet comes from this writer


def _modules():
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError:
        raise Trn2ValueError(
            "path: a .pftrace (Perfetto protobuf) trace needs the optional package perfetto: "
            "pip install 'trn2core[perfetto]' (or write a .json trace)"
        ) from None
    return pb, TraceProtoBuilder


def require_for(path) -> None:
    """Checks, before any work, that a trace to ``path`` can be written: a ``.pftrace`` needs
    the optional perfetto package (``Trn2ValueError`` saying how to install it)."""
    if str(path).lower().endswith(PROTOBUF_SUFFIXES):
        _modules()


def _ns(us: float) -> int:
    return round(us * 1000.0)


def to_protobuf(events: list[dict[str, Any]]) -> bytes:
    """The Perfetto protobuf trace of Chrome trace ``events`` (ours: ``X`` slices, ``C``
    counters, ``s``/``f`` flows, ``M`` process and thread names)."""
    pb, builder_cls = _modules()
    builder = builder_cls()
    uuid = iter(range(1, 1 << 62))
    process_name: dict[int, str] = {}
    thread_name: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process_name[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            thread_name[(e["pid"], e["tid"])] = e["args"]["name"]

    processes: dict[int, int] = {}
    tracks: dict[tuple[int, Any], int] = {}

    def descriptor(track_uuid: int, **fields: Any) -> None:
        p = builder.add_packet()
        p.trusted_packet_sequence_id = _SEQUENCE
        d = p.track_descriptor
        d.uuid = track_uuid
        for k, v in fields.items():
            if k == "pid":
                d.process.pid = v
                d.process.process_name = process_name.get(v, f"process {v}")
            elif k == "counter":
                d.counter.SetInParent()
            else:
                setattr(d, k, v)

    def process(pid: int) -> int:
        if pid not in processes:
            processes[pid] = next(uuid)
            descriptor(processes[pid], pid=pid)
        return processes[pid]

    def track(pid: int, tid: int) -> int:
        if (pid, tid) not in tracks:
            tracks[(pid, tid)] = next(uuid)
            name = thread_name.get((pid, tid), f"track {tid}")
            descriptor(tracks[(pid, tid)], parent_uuid=process(pid), name=name)
        return tracks[(pid, tid)]

    def counter(pid: int, name: str) -> int:
        if (pid, name) not in tracks:
            tracks[(pid, name)] = next(uuid)
            descriptor(
                tracks[(pid, name)], parent_uuid=process(pid), name=f"{name} (GB/s)", counter=True
            )
        return tracks[(pid, name)]

    slices = [e for e in events if e.get("ph") == "X"]
    # Flows join slices: a start binds to the slice on its track that encloses it, an end
    # (bp "e") to the slice that starts at its time.
    by_track: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    for i, e in enumerate(slices):
        by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], i))
    for lst in by_track.values():
        lst.sort()
    starts: dict[int, list[int]] = {}
    ends: dict[int, list[int]] = {}

    def enclosing(f: dict[str, Any]) -> int | None:
        lst = by_track.get((f["pid"], f["tid"]), [])
        k = bisect.bisect_right(lst, (f["ts"], float("inf"), 1 << 62)) - 1
        while k >= 0 and lst[k][0] <= f["ts"]:
            if f["ts"] <= lst[k][1]:
                return lst[k][2]
            k -= 1
        return None

    for f in events:
        if f.get("ph") in ("s", "f"):
            i = enclosing(f)
            if i is not None:
                (starts if f["ph"] == "s" else ends).setdefault(i, []).append(int(f["id"]))

    # (time, order, fill): at one time, ends before counters before begins, so that slices
    # back to back on a track do not nest.
    packets: list[tuple[int, int, int, Any]] = []
    for i, e in enumerate(slices):
        t = track(e["pid"], e["tid"])
        begin, end = _ns(e["ts"]), _ns(e["ts"] + e["dur"])
        packets.append((begin, 2, len(packets), ("begin", t, e, i, end == begin)))
        if end > begin:
            packets.append((end, 0, len(packets), ("end", t, e, i, False)))
    for e in events:
        if e.get("ph") == "C":
            t = counter(e["pid"], e["name"])
            value = next(iter(e["args"].values()))
            packets.append((_ns(e["ts"]), 1, len(packets), ("counter", t, value, 0, False)))
    packets.sort(key=lambda p: p[:3])
    for ts, _, _, (kind, t, e, i, instant) in packets:
        p = builder.add_packet()
        p.trusted_packet_sequence_id = _SEQUENCE
        p.timestamp = ts
        ev = p.track_event
        ev.track_uuid = t
        if kind == "counter":
            ev.type = pb.TrackEvent.TYPE_COUNTER
            ev.double_counter_value = float(e)
            continue
        if kind == "end":
            ev.type = pb.TrackEvent.TYPE_SLICE_END
            continue
        ev.type = pb.TrackEvent.TYPE_INSTANT if instant else pb.TrackEvent.TYPE_SLICE_BEGIN
        ev.name = e["name"]
        ev.flow_ids.extend(starts.get(i, []))
        ev.terminating_flow_ids.extend(ends.get(i, []))
        for k, v in e.get("args", {}).items():
            a = ev.debug_annotations.add()
            a.name = k
            if isinstance(v, bool):
                a.bool_value = v
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.double_value = v
            else:
                a.string_value = str(v)
    return builder.serialize()
