"""Consolidates a checkpoint by owner into plain torch files.

    python -m spillway.consolidate CHECKPOINT MODEL.pt [--optimizer OPTIMIZER.pt]

MODEL.pt gets the module's state_dict, one file that
`module.load_state_dict(torch.load(MODEL.pt))` reads without spillway.
OPTIMIZER.pt gets the optimizer's state_dict in torch's own layout (state
keyed by the parameter's position in the param_groups), which the same
optimizer class, built from the module's parameters in the saved order,
reads with `load_state_dict`. Note [Checkpoints by owner] in
_owner_checkpoint.py says what the checkpoint holds.
"""

import argparse
import os
import sys

import torch

from ._owner_checkpoint import (CheckpointError, read_manifest, read_shards, saved_module,
                                saved_optimizer)


def consolidated(directory):
    """The checkpoint's module state_dict, and its optimizer state_dict in
    torch's layout (None when it holds no optimizer)."""
    manifest = read_manifest(directory)
    shards = read_shards(directory, manifest)
    module = saved_module(directory, manifest, shards)
    if manifest["optimizer"] is None:
        return module, None
    return module, saved_optimizer(directory, manifest, shards)[0]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m spillway.consolidate",
        description="Writes a checkpoint by owner (spillway.save_checkpoint) as one torch "
        "state_dict file, and optionally the optimizer's state_dict in torch's layout.")
    parser.add_argument("checkpoint", help="the folder spillway.save_checkpoint wrote")
    parser.add_argument("model", help="where to write the module's state_dict")
    parser.add_argument("--optimizer", metavar="PATH",
                        help="where to write the optimizer's state_dict")
    args = parser.parse_args(argv)
    try:
        module, optimizer = consolidated(args.checkpoint)
        if args.optimizer is not None and optimizer is None:
            raise CheckpointError(f"the checkpoint in {args.checkpoint} holds no optimizer state")
    except CheckpointError as error:
        print(f"spillway.consolidate: {error}", file=sys.stderr)
        return 2
    torch.save(module, args.model)
    if args.optimizer is not None:
        torch.save(optimizer, args.optimizer)
    print(f"spillway.consolidate: {len(module)} module entries to {os.fspath(args.model)}"
          + ("" if args.optimizer is None else
             f", the state of {len(optimizer['state'])} parameters to {args.optimizer}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
