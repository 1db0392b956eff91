"""What manage:auto's global forward pre-hook (Note [Adopting models without
being told], python/spillway/_auto.py) adds to a forward: "adopted", once
every recorded module's root is adopted (the hook is gone), and "watching",
while a module that is never adopted keeps it installed (every module call
then takes torch's slow path and runs the hook).

A deep stack of small modules, so that the hook's share is as large as it
gets; the adopter's manage is a no-op (nothing goes into chunks), so only the
hook is measured. Prints the medians over rounds of the time per forward,
their ratios to plain torch and the time per module call.

    python3 bench/python/auto_hook_overhead.py [--rounds 15] [--forwards 200]
"""
import argparse
import statistics
import time

import torch

from spillway import _auto


def forward_seconds(model, x, forwards):
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(forwards):
            model(x)
    return (time.perf_counter() - start) / forwards


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--forwards", type=int, default=200)
    parser.add_argument("--layers", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    calls = 1 + len(layers)  # module calls per forward
    x = torch.randn(8, args.width)
    forward_seconds(model, x, args.forwards)  # warm up

    plain, adopted, watching = [], [], []
    for _ in range(args.rounds):
        plain.append(forward_seconds(model, x, args.forwards))
        _auto.install(lambda module_or_named, client: None)
        model(x)  # adopted (a no-op manage): every root is, so the hook goes
        adopted.append(forward_seconds(model, x, args.forwards))
        unused = torch.nn.Linear(2, 2)  # recorded, never adopted: the hook stays
        model(x)
        watching.append(forward_seconds(model, x, args.forwards))
        del unused
        _auto.uninstall()
    plain_s = statistics.median(plain)
    for name, seconds in (("adopted", statistics.median(adopted)),
                          ("watching", statistics.median(watching))):
        print(f"auto_hook_forward_{name}_us {seconds * 1e6:.1f}")
        print(f"auto_hook_{name}_ratio {seconds / plain_s:.3f}")
        print(f"auto_hook_{name}_ns_per_module_call {(seconds - plain_s) / calls * 1e9:.0f}")
    print(f"auto_hook_forward_plain_us {plain_s * 1e6:.1f}")


if __name__ == "__main__":
    main()
