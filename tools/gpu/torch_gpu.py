"""What the GPU checks in tools/gpu/ need of torch: 2.0 or later (for
CUDAPluggableAllocator) with a usable GPU. Scripts run as files, so this
directory is on sys.path and they import it by name."""


def missing_torch_gpu():
    """Why torch cannot run the GPU checks here (a line to print), or None."""
    try:
        import torch
    except ImportError:
        return "torch is not importable"
    if not torch.cuda.is_available() or not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        return (f"needs torch >= 2.0 with a GPU (torch {torch.__version__}, cuda available: "
                f"{torch.cuda.is_available()})")
    return None
