#!/usr/bin/env python3
"""A model of PyTorch's CUDA caching allocator, replayed on allocation traces.

Replays spillway-replay's CSV traces (action,ptr,size,stream,time_ns; see
docs/traces.md) through PyTorch's documented allocation rules and prints
peak reserved / peak allocated, the figure bench_replay prints for spillway
as replay_fragmentation_<trace>. With no memory limit nothing is ever
released, so the rules that matter are:

  - requests round up to 512 bytes; <= 1 MiB go to the small pool, the rest
    to the large pool; a block belongs to its stream;
  - best fit: the smallest free block of the pool on the stream, lowest
    address first;
  - a new segment (no fit): 2 MiB for a small request, 20 MiB for one under
    10 MiB, otherwise the request rounded up to 2 MiB;
  - split when the rest is >= 512 bytes (small pool) or > 1 MiB (large pool),
    the allocation taking the front; a free block merges with free
    neighbours;
  - allocated bytes count the block handed out (all of it when not split).

With --expandable (expandable_segments:True): one segment per stream and
pool on reserved address space; a request that fits no free block maps
pages after the segment's end, joining its free tail, in pages of 2 MiB
(small pool) or 20 MiB (large pool).

  pytorch_allocator_model.py [--expandable] TRACE.csv ...
"""

import argparse
import bisect
import csv
import sys

KIB = 1024
MIB = 1024 * KIB
ROUND = 512
SMALL_SIZE = 1 * MIB
SMALL_BUFFER = 2 * MIB
LARGE_BUFFER = 20 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB


def round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


class Block:
    __slots__ = ("address", "size", "stream", "small", "prev", "next", "free", "segment")

    def __init__(self, address, size, stream, small, segment):
        self.address = address
        self.size = size
        self.stream = stream
        self.small = small
        self.prev = None
        self.next = None
        self.free = True
        self.segment = segment

    def key(self):
        return (self.stream, self.size, self.address)


class Segment:
    __slots__ = ("base", "mapped", "tail")

    def __init__(self, base):
        self.base = base
        self.mapped = 0
        self.tail = None


class Pool:
    def __init__(self):
        self.keys = []
        self.blocks = {}

    def insert(self, block):
        key = block.key()
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block):
        key = block.key()
        index = bisect.bisect_left(self.keys, key)
        del self.keys[index]
        del self.blocks[key]

    def best_fit(self, stream, size):
        index = bisect.bisect_left(self.keys, (stream, size, -1))
        if index == len(self.keys) or self.keys[index][0] != stream:
            return None
        return self.blocks[self.keys[index]]


class Allocator:
    def __init__(self, expandable):
        self.expandable = expandable
        self.pools = {True: Pool(), False: Pool()}
        self.segments = {}  # (stream, small) -> Segment, expandable only
        self.next_address = 1 << 40
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0

    def new_address_range(self, size):
        address = self.next_address
        self.next_address += round_up(size, LARGE_BUFFER) + LARGE_BUFFER
        return address

    def reserve(self, size, stream, small):
        if self.expandable:
            return self.grow(size, stream, small)
        if small:
            segment_size = SMALL_BUFFER
        elif size < MIN_LARGE_ALLOC:
            segment_size = LARGE_BUFFER
        else:
            segment_size = round_up(size, ROUND_LARGE)
        block = Block(self.new_address_range(segment_size), segment_size, stream, small, None)
        self.reserved += segment_size
        self.pools[small].insert(block)
        return block

    def grow(self, size, stream, small):
        page = SMALL_BUFFER if small else LARGE_BUFFER
        segment = self.segments.get((stream, small))
        if segment is None:
            segment = Segment(self.new_address_range(1 << 44))
            self.segments[(stream, small)] = segment
        tail = segment.tail
        reused = tail.size if tail is not None and tail.free else 0
        grown = round_up(size - reused, page)
        self.reserved += grown
        end = segment.base + segment.mapped
        segment.mapped += grown
        pool = self.pools[small]
        if reused:
            pool.remove(tail)
            tail.size += grown
            pool.insert(tail)
            return tail
        block = Block(end, grown, stream, small, segment)
        block.prev = tail
        if tail is not None:
            tail.next = block
        segment.tail = block
        pool.insert(block)
        return block

    def allocate(self, size, stream):
        size = round_up(max(size, 1), ROUND)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = pool.best_fit(stream, size) or self.reserve(size, stream, small)
        pool.remove(block)
        rest = block.size - size
        if rest >= ROUND if small else rest > SMALL_SIZE:
            remainder = Block(block.address + size, rest, stream, small, block.segment)
            remainder.prev = block
            remainder.next = block.next
            if block.next is not None:
                block.next.prev = remainder
            block.next = remainder
            block.size = size
            if block.segment is not None and block.segment.tail is block:
                block.segment.tail = remainder
            pool.insert(remainder)
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def free(self, block):
        self.allocated -= block.size
        block.free = True
        pool = self.pools[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is None or not neighbour.free:
                continue
            pool.remove(neighbour)
            if neighbour is block.prev:
                block.address = neighbour.address
                block.prev = neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
                if block.segment is not None and block.segment.tail is neighbour:
                    block.segment.tail = block
            block.size += neighbour.size
        pool.insert(block)


def replay(path, expandable):
    allocator = Allocator(expandable)
    live = {}
    with open(path, newline="") as trace:
        rows = csv.reader(trace)
        header = next(rows)
        if header[:4] != ["action", "ptr", "size", "stream"]:
            sys.exit(f"{path}:1: not a trace CSV (header {','.join(header)})")
        for line, row in enumerate(rows, start=2):
            try:
                action, pointer, size, stream = row[0], row[1], int(row[2]), int(row[3])
            except (IndexError, ValueError):
                sys.exit(f"{path}:{line}: bad row {row}")
            if action == "alloc":
                if size > 0:
                    live[pointer] = allocator.allocate(size, stream)
            elif action == "free":
                block = live.pop(pointer, None)
                if block is not None:
                    allocator.free(block)
            else:
                sys.exit(f"{path}:{line}: unknown action '{action}'")
    return allocator


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expandable", action="store_true",
                        help="model expandable_segments:True")
    parser.add_argument("traces", nargs="+")
    args = parser.parse_args()
    mode = "expandable" if args.expandable else "segments"
    for path in args.traces:
        allocator = replay(path, args.expandable)
        name = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        ratio = allocator.peak_reserved / max(allocator.peak_allocated, 1)
        print(f"metric pytorch_{mode}_fragmentation_{name} {ratio:.3f} ratio "
              f"(peak reserved {allocator.peak_reserved}, peak allocated {allocator.peak_allocated})")


if __name__ == "__main__":
    main()
