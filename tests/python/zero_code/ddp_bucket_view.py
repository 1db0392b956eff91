"""A model wrapped in DistributedDataParallel with gradient_as_bucket_view,
one process over Gloo: under manage:auto it is refused, and manage:explicit
leaves it to torch."""
import os
import tempfile

import torch
import torch.distributed as dist

from _common import batches, mlp, print_tensors, train

with tempfile.TemporaryDirectory() as folder:
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}",
                            rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(mlp(64, 128, 8),
                                                      gradient_as_bucket_view=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train(model, optimizer, batches(1, 3, (16, 64), (16, 8)))
    print_tensors(model.named_parameters())
    dist.destroy_process_group()
