"""vramlab_torch: record the GPU memory a PyTorch training step would use,
without a GPU, as a PyTorch memory snapshot (the pickle
torch.cuda.memory._dump_snapshot() writes) that `vramlab replay` and
pytorch.org/memory_viz read.

    python -m vramlab_torch record my_model.py:build --input 32,3,224,224 \\
        --target classes:1000 --optimizer sgd --out step.pickle

    import vramlab_torch
    with vramlab_torch.record() as rec:      # default device: meta
        model = MyModel()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            loss = model(x).logsumexp(-1).mean()
            loss.backward(); opt.step(); opt.zero_grad()
    rec.save("step.pickle")

See the package README for what a recording on fake tensors cannot see.
"""

import warnings as _warnings

try:
    with _warnings.catch_warnings():
        # PyTorch without NumPy says so at import: nothing here needs NumPy.
        _warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch  # noqa: F401
except ImportError as e:  # pragma: no cover
    raise ImportError(
        "vramlab_torch records PyTorch programs and needs PyTorch: pip install torch "
        "(the CPU wheel is enough: nothing runs on a GPU)") from e

from .session import (CATEGORIES, Recording, RecordingError, RecordingWarning,  # noqa: E402
                      UsageError, record)
from .step import load_builder, record_step  # noqa: E402

__all__ = ["record", "Recording", "record_step", "load_builder", "CATEGORIES", "RecordingError",
           "RecordingWarning", "UsageError"]
__version__ = "0.1.0"
