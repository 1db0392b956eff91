#!/usr/bin/env python3
"""A plain PyTorch training script for tools/gpu/python_train_check.py.

It knows nothing of spillway unless --manage is given, which adds the one line
a script adds to put its parameters into chunks (spillway.manage(model)).
Prints one JSON line: the losses, a checksum of the final parameters, tokens
per second over the steps after the first, and peak reserved memory; with
--manage also spillway's figures (bytes moved, prefetches, stall time, the
policy and where op timing came from: memory_stats()).
"""
import argparse
import json
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--manage", action="store_true", help="spillway.manage(model)")
    parser.add_argument("--optimizer", choices=["torch", "spillway"], default="torch",
                        help="torch.optim.Adam or spillway.optim.Adam (state in chunks)")
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.LayerNorm(args.width), torch.nn.Linear(args.width, args.width),
                            torch.nn.GELU()) for _ in range(args.layers)]).cuda()
    if args.manage:
        import spillway
        spillway.manage(model)
    if args.optimizer == "spillway":
        import spillway.optim
        optimizer = spillway.optim.Adam(model.parameters(), lr=1e-4)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator(device="cuda").manual_seed(1)
    shape = (args.batch, args.sequence, args.width)
    inputs = torch.randn(shape, device="cuda", generator=generator)
    target = torch.randn(shape, device="cuda", generator=generator)
    losses = []
    start = None
    for step in range(args.steps):
        if step == 1:  # the first step pays for lazy setup
            torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in model.parameters())
    result = {
        "losses": losses,
        "checksum": checksum,
        "tokens_per_s": (args.steps - 1) * args.batch * args.sequence / seconds,
        "max_reserved": torch.cuda.max_memory_reserved(),
    }
    if args.manage:
        stats = spillway.memory_stats()
        result["spillway"] = {key: stats.get(key) for key in (
            "bytes_moved.h2d", "bytes_moved.d2h", "prefetches", "evictions", "stall_ns",
            "policy", "op_timing")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
