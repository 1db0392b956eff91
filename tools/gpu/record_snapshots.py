#!/usr/bin/env python3
"""Records PyTorch memory snapshots of real training steps on a GPU, for
spillway-replay (docs/traces.md): the workloads issue 18 compares spillway's
fragmentation against PyTorch's own caching allocator on.

Each workload trains a GPT from scratch under torch's own CUDA allocator
(spillway is not involved) with the memory history recorded from before the
model exists, so every block in the snapshot has its alloc in the trace, and
writes NAME.pickle with torch.cuda.memory._dump_snapshot. Stack frames are
not recorded (context=None): they are most of a snapshot's bytes and
spillway-replay does not read them.

  gpt2_small_sdpa      GPT-2 small (12 layers, d_model 768, vocab 50257),
                       fp32 weights, bf16 autocast, fused attention
                       (scaled_dot_product_attention), AdamW, batch 8 x 1024
                       tokens, 4 steps: the common modern recipe.
  long_context_eager   8 layers, d_model 1024, bf16 autocast, attention
                       written out (the score matrices materialised), AdamW,
                       batch 2 at 2048, 4096, 3072 and 4096 tokens: large
                       score buffers whose size varies by step.

    python3 tools/gpu/record_snapshots.py --out DIR [--only NAME]
    python3 tools/gpu/record_snapshots.py --dry-run   # no GPU: tiny shapes on the CPU

Prints one line per workload: its file, bytes, history entries, and torch's
own peak allocated and reserved. Exits 2 without a usable CUDA device
(except with --dry-run), 1 when a workload fails.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

GIB = 1 << 30


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, fused):
        super().__init__()
        self.heads = heads
        self.fused = fused
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
        self.up = torch.nn.Linear(d_model, 4 * d_model)
        self.down = torch.nn.Linear(4 * d_model, d_model)

    def attention(self, x):
        batch, seq, d_model = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
            out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(batch, seq, d_model))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(torch.nn.Module):
    def __init__(self, layers, d_model, heads, vocab, max_seq, fused):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d_model)
        self.position = torch.nn.Embedding(max_seq, d_model)
        self.blocks = torch.nn.ModuleList(Block(d_model, heads, fused) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d_model)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.embed.weight.t()  # tied head


# name -> model shape, batch, the sequence length of each step, fused attention
WORKLOADS = {
    "gpt2_small_sdpa": dict(layers=12, d_model=768, heads=12, vocab=50257, batch=8,
                            seqs=(1024, 1024, 1024, 1024), fused=True),
    "long_context_eager": dict(layers=8, d_model=1024, heads=16, vocab=32000, batch=2,
                               seqs=(2048, 4096, 3072, 4096), fused=False),
}
# --dry-run: the same code on the CPU at shapes that run in a second.
DRY_RUN_SHAPE = dict(layers=2, d_model=64, heads=4, vocab=128, batch=2)


def train(spec, device):
    torch.manual_seed(0)
    model = GPT(spec["layers"], spec["d_model"], spec["heads"], spec["vocab"],
                max(spec["seqs"]), spec["fused"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for seq in spec["seqs"]:
        tokens = torch.randint(spec["vocab"], (spec["batch"], seq + 1), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss, tokens
    return model, optimizer


def record(name, spec, out_dir):
    device = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(context=None, stacks="python")
    started = time.monotonic()
    try:
        model, optimizer = train(spec, device)
        torch.cuda.synchronize()
        path = os.path.join(out_dir, f"{name}.pickle")
        torch.cuda.memory._dump_snapshot(path)
        entries = sum(len(trace) for trace in torch.cuda.memory._snapshot()["device_traces"])
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    stats = torch.cuda.memory_stats()
    del model, optimizer
    print(f"record_snapshots: {name}: {path}, {os.path.getsize(path)} bytes, "
          f"{entries} history entries, torch peak allocated "
          f"{stats['allocated_bytes.all.peak'] / GIB:.3f} GiB, peak reserved "
          f"{stats['reserved_bytes.all.peak'] / GIB:.3f} GiB, "
          f"{time.monotonic() - started:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for NAME.pickle (default: .)")
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append",
                        help="record only this workload (repeatable)")
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: run each workload's steps on the CPU at tiny shapes")
    args = parser.parse_args()
    names = args.only or list(WORKLOADS)
    if args.dry_run:
        for name in names:
            spec = dict(WORKLOADS[name], **DRY_RUN_SHAPE, seqs=(8, 16))
            train(spec, torch.device("cpu"))
            print(f"record_snapshots: dry run: {name} trained on the CPU")
        return 0
    if not torch.cuda.is_available():
        print("record_snapshots: no usable CUDA device: nothing recorded")
        return 2
    os.makedirs(args.out, exist_ok=True)
    failures = 0
    for name in names:
        try:
            record(name, WORKLOADS[name], args.out)
        except Exception as error:  # the next workload may still record
            failures += 1
            print(f"record_snapshots: {name} FAILED: {type(error).__name__}: {error}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
