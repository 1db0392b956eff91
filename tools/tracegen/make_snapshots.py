#!/usr/bin/env python3
"""Writes PyTorch memory snapshots (torch.cuda.memory._dump_snapshot's pickle)
without torch or a GPU, for spillway-replay's tests and bench_replay.

A small model of PyTorch's CUDA caching allocator (its documented rules:
requests rounded up to 512 B; up to 1 MiB from the small pool, carved from
2 MiB segments; below 10 MiB from 20 MiB segments; larger ones rounded up to
2 MiB with a segment of their own; best fit on the same stream, splitting a
block when the rest is worth keeping (>= 512 B small, > 1 MiB large);
neighbours merged on free; segments returned only by empty_cache() or when
cudaMalloc fails) serves the allocations of tools/tracegen/make_traces.py's
GPT-2 training steps and records the history entries PyTorch records (alloc,
free_requested, free_completed, segment_alloc, segment_free, oom), with
frames. The snapshot is the dict torch.cuda.memory._snapshot() returns:
segments with their blocks at the end, and device_traces, pickled with
protocol 4 as pickle.dump does by default.

Beside each snapshot NAME.pickle it writes what spillway-replay must get from
it, computed here from the model's own state rather than from the pickle:
  NAME.events.csv  the alloc/free events, blocks live before the history
                   first (docs/traces.md), and an empty_cache event where a
                   run of segment releases starts, in spillway-replay's CSV
                   form;
  NAME.expected    `key value` lines: entries, allocs, frees, cache_releases,
                   blocks_live_before_trace, native_peak_reserved_bytes,
                   native_peak_allocated_bytes, ooms (for the broken files:
                   file_size, error_offset).

Files:
  transformer_train   GPT-2 small shapes, 4 layers, AMP, 3 steps (batch 2, 2,
                      4), empty_cache() before the batch grows; the whole
                      history.
  mid_run             2 layers, 3 steps, a side stream whose blocks are freed
                      late (record_stream), a failed 200 GiB request (cached
                      segments returned, then oom) on a 64 GiB device,
                      and a history of max_entries that began mid-run; a
                      second device with its own short trace
                      (mid_run.device1.*).
  mid_run_p2          the same dict pickled with protocol 2.
  mid_run_no_completed  recorded with skip_actions=["free_completed"].
  truncated           transformer_train cut two thirds of the way.
  class_reference     a snapshot whose allocator_settings is an OrderedDict
                      (a class reference, STACK_GLOBAL).

    python3 tools/tracegen/make_snapshots.py --out DIR

Python 3 standard library only; deterministic.
"""

import argparse
import collections
import os
import pickle
import pickletools
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_traces  # noqa: E402  (the GPT-2 training steps)

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# PyTorch's CUDACachingAllocator constants.
MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB      # largest request of the small pool
SMALL_BUFFER = 2 * MIB    # small pool segments
LARGE_BUFFER = 20 * MIB   # segments for requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB

MAIN_STREAM = 0
SIDE_STREAM = 0x55D4C8A1F0E0  # a cudaStream_t, as the snapshot prints it

FRAMES = {
    "forward": [
        {"filename": "/venv/lib/python3.11/site-packages/transformers/models/gpt2/modeling_gpt2.py",
         "line": 386, "name": "forward"},
        {"filename": "train.py", "line": 57, "name": "train_step"},
    ],
    "backward": [
        {"filename": "/venv/lib/python3.11/site-packages/torch/autograd/graph.py",
         "line": 825, "name": "_engine_run_backward"},
        {"filename": "train.py", "line": 61, "name": "train_step"},
    ],
}


def round_size(size):
    return MIN_BLOCK if size < MIN_BLOCK else (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def allocation_size(size):
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class OutOfMemory(Exception):
    pass


class Block:
    def __init__(self, segment, address, size):
        self.segment = segment
        self.address = address
        self.size = size
        self.requested = 0
        self.allocated = False
        self.pending = False  # freed, waiting for other streams (record_stream)
        self.prev = None
        self.next = None


class Segment:
    def __init__(self, address, size, stream, small):
        self.address = address
        self.size = size
        self.stream = stream
        self.small = small
        self.first = Block(self, address, size)


class CachingAllocatorModel:
    """PyTorch's caching allocator for one device, recording history entries."""

    def __init__(self, device, base_address, capacity=None):
        self.device = device
        self.capacity = capacity
        self.next_address = base_address
        self.segments = []
        self.free_blocks = []         # cached, not allocated, not pending
        self.by_address = {}          # allocated or pending blocks
        self.pending = []             # (mallocs left until complete, block)
        self.entries = []
        self.reserved = 0
        self.reserved_after = []      # reserved bytes after each entry
        self.time_us = 1_000_000
        self.frames = "forward"

    # ---- history ----

    def record(self, action, size, stream, addr=None, device_free=None):
        self.time_us += 3 + size // (2 * MIB)
        entry = {"action": action}
        if action == "oom":
            entry["device_free"] = device_free
        else:
            entry["addr"] = addr
        entry["size"] = size
        entry["stream"] = stream
        entry["frames"] = FRAMES[self.frames]
        entry["time_us"] = self.time_us
        self.entries.append(entry)
        self.reserved_after.append(self.reserved)

    # ---- the device ----

    def cuda_malloc(self, size, stream, small):
        if self.capacity is not None and self.reserved + size > self.capacity:
            return None
        segment = Segment(self.next_address, size, stream, small)
        self.next_address += (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE + ROUND_LARGE
        self.segments.append(segment)
        self.reserved += size
        self.record("segment_alloc", size, stream, addr=segment.address)
        return segment

    def release_cached(self):
        """empty_cache() and the retry after a failed cudaMalloc: every
        segment that is one free block goes back to the device."""
        for segment in list(self.segments):
            block = segment.first
            if block.next is None and not block.allocated and not block.pending:
                self.free_blocks.remove(block)
                self.segments.remove(segment)
                self.reserved -= segment.size
                self.record("segment_free", segment.size, segment.stream, addr=segment.address)

    # ---- malloc / free ----

    def malloc(self, size, stream=MAIN_STREAM):
        self.process_events()
        rounded = round_size(size)
        small = rounded <= SMALL_SIZE
        block = self.best_fit(rounded, stream, small)
        if block is None:
            alloc_size = allocation_size(rounded)
            segment = self.cuda_malloc(alloc_size, stream, small)
            if segment is None:
                self.synchronize_and_complete()
                self.release_cached()
                segment = self.cuda_malloc(alloc_size, stream, small)
            if segment is None:
                device_free = self.capacity - self.reserved
                self.record("oom", alloc_size, stream, device_free=device_free)
                raise OutOfMemory(size)
            block = segment.first
            self.free_blocks.append(block)
        self.free_blocks.remove(block)
        remaining = block.size - rounded
        if (remaining >= MIN_BLOCK) if small else (remaining > SMALL_SIZE):
            rest = Block(block.segment, block.address + rounded, remaining)
            rest.prev, rest.next = block, block.next
            if block.next:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self.free_blocks.append(rest)
        block.allocated = True
        block.requested = size
        self.by_address[block.address] = block
        self.record("alloc", size, stream, addr=block.address)
        return block.address

    def best_fit(self, rounded, stream, small):
        best = None
        for block in self.free_blocks:
            if (block.segment.stream == stream and block.segment.small == small
                    and block.size >= rounded
                    and (best is None or (block.size, block.address) < (best.size, best.address))):
                best = block
        return best

    def free(self, address, used_on_other_stream=False):
        block = self.by_address[address]
        block.allocated = False
        self.record("free_requested", block.requested, block.segment.stream, addr=address)
        if used_on_other_stream:
            block.pending = True
            self.pending.append([3, block])  # its event completes 3 mallocs later
        else:
            self.free_block(block)

    def free_block(self, block):
        block.pending = False
        del self.by_address[block.address]
        self.record("free_completed", block.requested, block.segment.stream, addr=block.address)
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated or neighbour.pending:
                continue
            self.free_blocks.remove(neighbour)
            if neighbour is block.prev:
                neighbour.size += block.size
                neighbour.next = block.next
                if block.next:
                    block.next.prev = neighbour
                block = neighbour
            else:
                block.size += neighbour.size
                block.next = neighbour.next
                if neighbour.next:
                    neighbour.next.prev = block
        block.requested = 0
        self.free_blocks.append(block)

    def process_events(self):
        for item in list(self.pending):
            item[0] -= 1
            if item[0] <= 0:
                self.pending.remove(item)
                self.free_block(item[1])

    def synchronize_and_complete(self):
        for _, block in list(self.pending):
            self.free_block(block)
        self.pending = []

    def empty_cache(self):
        self.synchronize_and_complete()
        self.release_cached()

    # ---- the snapshot's segments ----

    def segment_dicts(self):
        out = []
        for segment in sorted(self.segments, key=lambda s: s.address):
            blocks = []
            block = segment.first
            while block is not None:
                state = ("active_allocated" if block.allocated
                         else "active_pending_free" if block.pending else "inactive")
                blocks.append({"address": block.address, "size": block.size,
                               "requested_size": block.requested, "state": state,
                               "frames": FRAMES["forward"] if state != "inactive" else []})
                block = block.next
            out.append({
                "device": self.device,
                "address": segment.address,
                "total_size": segment.size,
                "allocated_size": sum(b["size"] for b in blocks
                                      if b["state"] == "active_allocated"),
                "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                "requested_size": sum(b["requested_size"] for b in blocks),
                "stream": segment.stream,
                "segment_type": "small" if segment.small else "large",
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            })
        return out


class AllocatorTrace:
    """make_traces.Gpt2Run's trace interface (alloc, free, free_all, live),
    served by the allocator model."""

    def __init__(self, model):
        self.model = model
        self.live = {}

    def alloc(self, size):
        ptr = self.model.malloc(size)
        self.live[ptr] = size
        return ptr

    def free(self, ptr):
        self.live.pop(ptr)
        self.model.free(ptr)

    def free_all(self, ptrs):
        for ptr in ptrs:
            self.free(ptr)


class BackwardFrames:
    """Switches the frames recorded to backward's for the duration of
    Gpt2Run.backward (a realistic mix of stacks in the trace)."""

    def __init__(self, run, model):
        original = run.backward

        def backward(*args, **kwargs):
            model.frames = "backward"
            try:
                return original(*args, **kwargs)
            finally:
                model.frames = "forward"
        run.backward = backward


# ---- expectations, from the model's whole history ----

def expectations(model, entries, window_start, segments, free_action):
    """What spillway-replay must read from the snapshot whose history is
    entries[window_start:] (entries: the model's whole history, with the
    actions the recording kept)."""
    live = {}  # address -> (size, stream), from the whole history
    for entry in entries[:window_start]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = (entry["size"], entry["stream"])
        elif entry["action"] == free_action:
            del live[entry["addr"]]
    window = entries[window_start:]
    body = []  # alloc, free and, once per run of segment releases, empty_cache
    for e in window:
        if e["action"] in ("alloc", free_action):
            body.append(e)
        elif e["action"] in ("segment_free", "segment_unmap"):
            if not body or body[-1]["action"] != "empty_cache":
                body.append({"action": "empty_cache", "addr": 0, "size": 0, "stream": 0,
                             "time_us": e["time_us"]})
    first_time_ns = next((e["time_us"] * 1000 for e in body if e["action"] != "empty_cache"), 0)
    before = []
    touched = set()
    for entry in body:
        if entry["action"] == "empty_cache":
            continue
        address = entry["addr"]
        if entry["action"] == free_action and address in live and address not in touched:
            size, stream = live[address]
            before.append(("alloc", address, size, stream, first_time_ns))
        touched.add(address)
    for segment in segments:
        if segment["device"] != model.device:
            continue
        for block in segment["blocks"]:
            if block["state"].startswith("active") and block["address"] not in touched:
                size, stream = live[block["address"]]  # KeyError: a block the history misses
                assert (size, stream) == (block["requested_size"], segment["stream"])
                before.append(("alloc", block["address"], size, stream, first_time_ns))
    kinds = {"alloc": "alloc", free_action: "free", "empty_cache": "empty_cache"}
    events = before + [(kinds[e["action"]], e["addr"], e["size"], e["stream"],
                        e["time_us"] * 1000) for e in body]

    # PyTorch's reserved bytes, as the model kept them; allocated bytes as
    # rounded live requests, with the frees the replay uses.
    reserved_at_start = model.reserved_after[window_start - 1] if window_start else 0
    peak_reserved = max([reserved_at_start] + model.reserved_after[window_start:])
    allocated = sum(round_size(size) for size, _ in live.values())
    peak_allocated = allocated
    sizes = dict((address, size) for address, (size, _) in live.items())
    for entry in body:
        if entry["action"] == "alloc":
            sizes[entry["addr"]] = entry["size"]
            allocated += round_size(entry["size"])
            peak_allocated = max(peak_allocated, allocated)
        elif entry["action"] != "empty_cache":
            allocated -= round_size(sizes.pop(entry["addr"]))
    expected = {
        "entries": len(window),
        "allocs": sum(1 for e in events if e[0] == "alloc"),
        "frees": sum(1 for e in events if e[0] == "free"),
        "cache_releases": sum(1 for e in events if e[0] == "empty_cache"),
        "blocks_live_before_trace": len(before),
        "native_peak_reserved_bytes": peak_reserved,
        "native_peak_allocated_bytes": peak_allocated,
        "ooms": sum(1 for e in window if e["action"] == "oom"),
    }
    return events, expected


def write_expectations(out, name, events, expected):
    with open(os.path.join(out, name + ".events.csv"), "w", newline="\n") as f:
        f.write("action,ptr,size,stream,time_ns\n")
        for action, address, size, stream, time_ns in events:
            f.write(f"{action},{address:#x},{size},{stream:#x},{time_ns}\n")
    write_keys(out, name, expected)


def write_keys(out, name, keys):
    with open(os.path.join(out, name + ".expected"), "w", newline="\n") as f:
        for key, value in keys.items():
            f.write(f"{key} {value}\n")


def snapshot_dict(segments, device_traces):
    return {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0,
                               "expandable_segments": False,
                               "roundup_power2_divisions": {"1": 0, "2": 0}},
        "external_annotations": [],
    }


def write_pickle(path, data, protocol=4):
    with open(path, "wb") as f:
        pickle.dump(data, f, protocol=protocol)
    with open(path, "rb") as f:
        return f.read()


# ---- the scenarios ----

def transformer_train(out):
    model = run_transformer()
    assert any(e["action"] == "segment_free" for e in model.entries)  # from empty_cache()
    segments = model.segment_dicts()
    data = write_pickle(os.path.join(out, "transformer_train.pickle"),
                        snapshot_dict(segments, [model.entries]))
    events, expected = expectations(model, model.entries, 0, segments, "free_completed")
    write_expectations(out, "transformer_train", events, expected)
    return data, expected


def run_transformer():
    model = CachingAllocatorModel(0, 0x7F2A00000000)
    trace = AllocatorTrace(model)
    run = make_traces.Gpt2Run(trace, 4, 768, 12, "amp", "eager")
    BackwardFrames(run, model)
    run.setup()
    for step, batch in enumerate([2, 2, 4]):
        if step == 2:
            model.empty_cache()  # before the batch grows, as some loops do
        run.step(batch)
    return model


def mid_run(out):
    model = CachingAllocatorModel(0, 0x7F3C00000000, capacity=64 * GIB)
    trace = AllocatorTrace(model)
    run = make_traces.Gpt2Run(trace, 2, 768, 12, "amp", "eager")
    BackwardFrames(run, model)
    run.setup()
    for step in range(3):
        # A batch staged on a side stream and used on the main one
        # (record_stream): its free completes later.
        staged = model.malloc(3 * MIB + 4096, SIDE_STREAM)
        run.step(1)
        model.free(staged, used_on_other_stream=True)
        if step == 1:
            try:
                model.malloc(200 * GIB)  # a probe that fails; training goes on
            except OutOfMemory:
                pass
    segments = model.segment_dicts()

    # Device 1: a short history of its own.
    other = CachingAllocatorModel(1, 0x7F5E00000000)
    a = other.malloc(5000)
    b = other.malloc(3 * MIB)
    other.free(a)
    other.malloc(12 * MIB + 1)
    other.free(b)
    segments_1 = other.segment_dicts()

    # The history keeps its last max_entries entries: it began mid-run.
    max_entries = len(model.entries) * 3 // 5
    start = len(model.entries) - max_entries
    window = model.entries[start:]
    data = snapshot_dict(segments + segments_1, [window, other.entries])
    write_pickle(os.path.join(out, "mid_run.pickle"), data)
    write_pickle(os.path.join(out, "mid_run_p2.pickle"), data, protocol=2)
    events, expected = expectations(model, model.entries, start, segments, "free_completed")
    assert expected["blocks_live_before_trace"] > 0
    write_expectations(out, "mid_run", events, expected)
    write_expectations(out, "mid_run_p2", events, expected)
    events_1, expected_1 = expectations(other, other.entries, 0, segments_1, "free_completed")
    write_expectations(out, "mid_run.device1", events_1, expected_1)

    # The same run recorded with skip_actions=["free_completed"]: the ring
    # buffer holds max_entries of what was kept.
    kept = [e for e in model.entries if e["action"] != "free_completed"]
    # reserved_after must follow the kept entries for the expectations.
    kept_model = CachingAllocatorModel(0, 0)
    kept_model.reserved_after = [r for e, r in zip(model.entries, model.reserved_after)
                                 if e["action"] != "free_completed"]
    kept_start = len(kept) - max_entries
    write_pickle(os.path.join(out, "mid_run_no_completed.pickle"),
                 snapshot_dict(segments, [kept[kept_start:]]))
    events, expected = expectations(kept_model, kept, kept_start, segments, "free_requested")
    write_expectations(out, "mid_run_no_completed", events, expected)
    return expected


def broken_files(out, transformer_bytes):
    # Cut two thirds of the way; the error names the opcode the cut falls in.
    size = len(transformer_bytes) * 2 // 3
    with open(os.path.join(out, "truncated.pickle"), "wb") as f:
        f.write(transformer_bytes[:size])
    error_offset = None
    for _, _, position in pickletools.genops(transformer_bytes):
        if position >= size:
            break
        error_offset = position
    write_keys(out, "truncated", {"file_size": size, "error_offset": error_offset})

    # A class reference: allocator_settings as an OrderedDict.
    data = snapshot_dict([], [[]])
    data["allocator_settings"] = collections.OrderedDict(data["allocator_settings"])
    raw = write_pickle(os.path.join(out, "class_reference.pickle"), data)
    offset = next(position for op, _, position in pickletools.genops(raw)
                  if op.name == "STACK_GLOBAL")
    write_keys(out, "class_reference", {"file_size": len(raw), "error_offset": offset})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    data, expected = transformer_train(args.out)
    print(f"transformer_train.pickle: {len(data)} bytes, {expected}", file=sys.stderr)
    expected = mid_run(args.out)
    print(f"mid_run.pickle: {expected}", file=sys.stderr)
    broken_files(args.out, data)


if __name__ == "__main__":
    main()
