"""Checkpoints by owner: each data parallel rank writes what it owns.

Note [Checkpoints by owner]: under data parallel training (Note [Data
parallel over chunk groups] in hooks/torch/data_parallel.cc) each tensor,
and its optimizer state, has one owner; the state exists on that rank alone.
save_checkpoint() therefore writes one shard per rank, holding by name the
module's tensors the rank owns and their optimizer state, and nothing twice.
Names, not indices or chunk positions, key everything, so a checkpoint loads
at any world size (1 included, and into plain torch after consolidate.py):
load_checkpoint() reads every shard's tensors into the module, since every
rank holds every parameter, and hands the optimizer the state of what this
rank owns under the current layout.

A checkpoint is complete when its manifest exists. Rank 0 removes an old
manifest first, every rank then writes its shard (beside, then renamed), and
rank 0 writes the manifest last, after a barrier that every rank reaches
only once its shard is in place. A save that dies halfway leaves a folder
without a manifest, which load_checkpoint() refuses, never a mix of two
saves' shards.

Layout of a checkpoint folder:
- manifest.json: format, version, world_size, the shard files, and for each
  module entry (state_dict's names) its shard, dtype and shape; for each
  parameter with optimizer state, its shard; the optimizer's class.
- rank<r>-of-<N>.pt (torch.save): {"module": {name: tensor}, "optimizer_state":
  {name: state}}; rank 0's also holds "optimizer_param_groups", the
  optimizer's param_groups with each "params" list given as names.
"""

import json
import os

import torch

from . import _C
from . import _checkpoint

FORMAT = "spillway-checkpoint-by-owner"
VERSION = 1
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or does not fit what loads it."""


def shard_name(rank, world_size):
    return f"rank{rank:05d}-of-{world_size:05d}.pt"


def _module_entries(module):
    """The module's state_dict entries, by name, as the tensors themselves."""
    return module.state_dict(keep_vars=True)


def _parameter_names(module):
    names = {}
    for name, param in module.named_parameters():
        names.setdefault(param, name)
    return names


def _optimizer_params(optimizer):
    return [param for group in optimizer.param_groups for param in group["params"]]


def _optimizer_names(optimizer, module):
    """The name of each of the optimizer's parameters, in its order."""
    names = _parameter_names(module)
    result = []
    for index, param in enumerate(_optimizer_params(optimizer)):
        if param not in names:
            raise CheckpointError(
                f"the optimizer's parameter #{index} ({tuple(param.shape)}) is not a parameter "
                "of the module: a checkpoint by owner keys the state by the module's names")
        result.append(names[param])
    return result


def _writers(tensors):
    """The rank that writes each tensor: its owner; rank 0 for one that
    spillway does not manage, which every rank holds."""
    return [max(owner, 0) for owner in _C.data_parallel_owners(list(tensors))]


def _taken_here(tensors, rank):
    """Whether this rank takes each tensor's optimizer state: it owns it, or
    spillway does not manage it."""
    return [owner in (-1, rank) for owner in _C.data_parallel_owners(list(tensors))]


def _write_atomically(path, write):
    partial = path + ".partial"
    write(partial)
    os.replace(partial, path)


def save_checkpoint(directory, module, optimizer=None):
    """Writes `module`'s state_dict and `optimizer`'s state into `directory`,
    each rank the tensors it owns (Note [Checkpoints by owner]). A
    collective under data parallel training: every rank calls it with the
    same module and optimizer, after the optimizer's step. Without a process
    group it writes one shard."""
    directory = os.fspath(directory)
    rank, world = _C.data_parallel_rank(), _C.data_parallel_world_size()
    manifest_path = os.path.join(directory, MANIFEST)
    if rank == 0:
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(manifest_path):
            os.remove(manifest_path)
    _C.barrier("starting a checkpoint")  # no rank writes before the old manifest is gone
    os.makedirs(directory, exist_ok=True)

    entries = _module_entries(module)
    names = list(entries)
    entry_owners = dict(zip(names, _writers(entries.values())))
    shard = {"module": {}, "optimizer_state": {}}
    # Note [Uses only the owner makes] (hooks/torch/sharded_params.cc): the
    # entries this rank writes are its own.
    with torch.no_grad(), _C._OwnerUses():
        for name in names:
            if entry_owners[name] == rank:
                # A copy through an op: the chunk is fetched wherever it is.
                shard["module"][name] = _checkpoint._copy_of(entries[name])
    state_owners = {}
    if optimizer is not None:
        param_names = _optimizer_names(optimizer, module)
        state_dict = optimizer.state_dict()
        params = _optimizer_params(optimizer)
        writers = _writers(params)
        written = [None] * len(params)
        for index, writer in enumerate(writers):
            if writer == rank and index in state_dict["state"]:
                shard["optimizer_state"][param_names[index]] = state_dict["state"][index]
                written[index] = 1.0
        # Which parameters have state at all is known on their writers only.
        written = _C.owned_figures_everywhere(written, "which parameters have optimizer state")
        state_owners = {param_names[index]: writers[index]
                        for index, figure in enumerate(written) if figure is not None}
        if rank == 0:
            positions = iter(param_names)
            shard["optimizer_param_groups"] = [
                {**group, "params": [next(positions) for _ in group["params"]]}
                for group in state_dict["param_groups"]]
    _write_atomically(os.path.join(directory, shard_name(rank, world)),
                      lambda path: torch.save(shard, path))
    _C.barrier("writing the checkpoint's shards")  # every shard is in place
    if rank != 0:
        return
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "world_size": world,
        "shards": [shard_name(r, world) for r in range(world)],
        "module": {name: {"shard": entry_owners[name], "dtype": str(entries[name].dtype),
                          "shape": list(entries[name].shape)} for name in names},
        "optimizer": None if optimizer is None else {
            "class": type(optimizer).__name__, "state": state_owners},
    }

    def write_manifest(path):
        with open(path, "w") as file:
            json.dump(manifest, file, indent=1)

    _write_atomically(manifest_path, write_manifest)


def read_manifest(directory):
    """The manifest of a complete checkpoint; CheckpointError otherwise."""
    path = os.path.join(os.fspath(directory), MANIFEST)
    if not os.path.isfile(path):
        raise CheckpointError(
            f"{path} does not exist: {directory} is not a complete checkpoint by owner "
            "(a save that did not finish writes no manifest)")
    try:
        with open(path) as file:
            manifest = json.load(file)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} cannot be read: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a manifest of a checkpoint by owner "
                              f"(its format is not {FORMAT!r})")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{path} has version {manifest.get('version')!r}; this spillway "
                              f"reads version {VERSION}")
    missing = [key for key in ("world_size", "shards", "module", "optimizer")
               if key not in manifest]
    if missing:
        raise CheckpointError(f"{path} lacks {', '.join(missing)}")
    shard_count = len(manifest["shards"])
    for name, info in manifest["module"].items():
        if not 0 <= info.get("shard", -1) < shard_count:
            raise CheckpointError(f"{path} puts '{name}' in shard {info.get('shard')!r}, "
                                  f"of {shard_count}")
    return manifest


def read_shard(directory, manifest, index):
    path = os.path.join(os.fspath(directory), manifest["shards"][index])
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}, shard {index} of the checkpoint, does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several kinds for a bad file
        raise CheckpointError(f"{path}, shard {index} of the checkpoint, cannot be read: "
                              f"{error}") from error


def _check_module_fits(manifest, entries, directory):
    saved = manifest["module"]
    missing = [name for name in entries if name not in saved]
    unexpected = [name for name in saved if name not in entries]
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint in {directory} does not fit the module: "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    for name, tensor in entries.items():
        if list(tensor.shape) != saved[name]["shape"] or str(tensor.dtype) != saved[name]["dtype"]:
            raise CheckpointError(
                f"'{name}' is {saved[name]['dtype']} {saved[name]['shape']} in the checkpoint in "
                f"{directory}, the module's is {tensor.dtype} {list(tensor.shape)}")


def read_shards(directory, manifest):
    with _C._HostWork():  # what is read is host data, off the device budget
        return [read_shard(directory, manifest, index)
                for index in range(len(manifest["shards"]))]


def saved_module(directory, manifest, shards):
    """The module's state_dict as saved, by name."""
    values = {}
    for name, info in manifest["module"].items():
        held = shards[info["shard"]]["module"]
        if name not in held:
            raise CheckpointError(f"'{name}' is missing from shard {info['shard']} of the "
                                  f"checkpoint in {directory}")
        values[name] = held[name]
    return values


def saved_optimizer(directory, manifest, shards, wanted=lambda name: True):
    """The optimizer's state_dict as saved, in torch's layout (indices in the
    saved param_groups' order), with the state of the `wanted` names only,
    and the parameters' names in that order."""
    if manifest["optimizer"] is None:
        raise CheckpointError(f"the checkpoint in {directory} holds no optimizer state")
    groups = shards[0].get("optimizer_param_groups")
    if groups is None:
        raise CheckpointError(f"shard 0 of the checkpoint in {directory} has no "
                              "optimizer_param_groups")
    names = [name for group in groups for name in group["params"]]
    index_of = {name: index for index, name in enumerate(names)}
    state = {}
    for name, shard in manifest["optimizer"]["state"].items():
        if not wanted(name):
            continue
        saved = shards[shard]["optimizer_state"]
        if name not in saved or name not in index_of:
            raise CheckpointError(f"the optimizer state of '{name}' is missing from shard "
                                  f"{shard} of the checkpoint in {directory}")
        state[index_of[name]] = saved[name]
    param_groups = [{**group, "params": [index_of[name] for name in group["params"]]}
                    for group in groups]
    return {"state": dict(sorted(state.items())), "param_groups": param_groups}, names


def load_checkpoint(directory, module, optimizer=None):
    """Reads a checkpoint by owner, saved at any world size, into `module`
    and `optimizer` (Note [Checkpoints by owner]). Under data parallel
    training, call it on every rank after manage(): each rank takes every
    tensor's values and the optimizer state of what it owns now. Raises
    CheckpointError naming what does not fit."""
    directory = os.fspath(directory)
    manifest = read_manifest(directory)
    entries = _module_entries(module)
    _check_module_fits(manifest, entries, directory)
    with _C._HostWork():  # what is read is host data, off the device budget
        shards = read_shards(directory, manifest)
    values = saved_module(directory, manifest, shards)
    module.load_state_dict(values)  # copy_, an op: each chunk is fetched
    if optimizer is None:
        return
    names = _optimizer_names(optimizer, module)
    taken = {name for name, here in zip(
        names, _taken_here(_optimizer_params(optimizer), _C.data_parallel_rank())) if here}
    state_dict, saved_names = saved_optimizer(directory, manifest, shards, taken.__contains__)
    if saved_names != names:
        raise CheckpointError(
            f"the optimizer's parameters are not those of the checkpoint in {directory}, in "
            f"that order (saved {len(saved_names)}, this optimizer has {len(names)})")
    optimizer.load_state_dict(state_dict)
