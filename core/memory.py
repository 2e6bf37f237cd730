"""Whether a model's weights fit in the memory its device has free, asked before loading them.

A CPU that runs out of memory ends the process without an error to read (or swaps for minutes
first), and the weights loaded can take several times what is on disk: a GGUF file's quantized
weights are dequantized (an 8B model's 4.9 GB of Q4_K_M are 32 GB of float32), and a checkpoint
stored in bfloat16 doubles in float32, the CPU's default. So a load whose weights alone cannot fit
is refused first, naming the sizes and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .errors import ModelLoadError


def _check_one(name: str, elements: int, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse `elements` weights in `dtype` that need more than `device` has free (nothing is
    refused where the free memory cannot be told: a hub download, an MPS device)."""
    free = _free_bytes(device)
    size = _element_size(dtype)
    need = elements * size
    if free is None or need <= free:
        return
    fix = (
        f'load it in bfloat16 (dtype="bfloat16", or Local(path, dtype="bfloat16") for this '
        f"member: {_gb(elements * 2)})"
        if size > 2
        else "load a smaller model"
    )
    raise ModelLoadError(
        f"{name!r} holds {elements:,} weights: in {str(dtype).removeprefix('torch.')} they take "
        f"{_gb(need)}, and {device} has {_gb(free)} free. Free memory, {fix}, or use a machine "
        "with more memory."
    )


def check_all_fit(loads: Sequence[tuple[str, int, torch.device, torch.dtype]]) -> None:
    """Refuse (name, weights, device, dtype) loads whose weights, summed per device, need more
    than the device has free."""
    devices: dict[str, list[tuple[str, int, torch.dtype]]] = {}
    for name, elements, device, dtype in loads:
        devices.setdefault(str(device), []).append((name, elements, dtype))
    for device, group in devices.items():
        if len(group) == 1:
            name, elements, dtype = group[0]
            _check_one(name, elements, torch.device(device), dtype)
            continue
        free = _free_bytes(torch.device(device))
        sizes = [(name, elements * _element_size(dtype)) for name, elements, dtype in group]
        need = sum(size for _, size in sizes)
        if free is None or need <= free:
            continue
        each = ", ".join(f"{name!r} {_gb(size)}" for name, size in sizes)
        wide = any(_element_size(dtype) > 2 for _, _, dtype in group)
        halve = 'load them in bfloat16 (dtype="bfloat16"), ' if wide else ""
        raise ModelLoadError(
            f"the members on {device} take {_gb(need)} together ({each}), and {device} has "
            f"{_gb(free)} free. Free memory, {halve}put some on another device "
            "(Local(path, device=...)), or use fewer or smaller members."
        )


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _free_bytes(device: torch.device) -> int | None:
    """Memory free on `device` now (None where it cannot be told)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        import psutil

        return psutil.virtual_memory().available
    return None


def _gb(count: int) -> str:
    return f"{count / 1e9:.1f} GB"
