"""What each PyTorch profiler (Kineto) category is, in every generation of the profiler.

libkineto's ActivityType names (`kernel`, `gpu_memcpy`, `cuda_runtime`, `cpu_op`...) are
today's; the PyTorch 1.8-1.9 profiler wrote capitalised ones (`Kernel`, `Memcpy`,
`Memset`, `Runtime`, `Operator`, `User`) and some 1.10 builds `gpu_user_Annotation`. Each
is read as its current name. A category no generation names is host work that the import
counts and warns about (`unrecognised`), never silent.
"""

from __future__ import annotations

# Every generation's category names (libkineto's ActivityType strings; the PyTorch 1.8-1.9
# profiler wrote capitalised ones: `Kernel`, `Memcpy`, `Memset`, `Runtime`, `Operator`,
# `User`; some 1.10 builds `gpu_user_Annotation`), each to what it is now.
_ALIASES = {
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "Runtime": "cuda_runtime",
    "Driver": "cuda_driver",
    "Operator": "cpu_op",
    "User": "user_annotation",
    "User annotation": "user_annotation",
    "gpu_user_Annotation": "gpu_user_annotation",
    "GPU user annotation": "gpu_user_annotation",
}
DEVICE_CATS = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "xpu_sync", "mtia_ccp_events"}
)
LAUNCH_CATS = frozenset(
    {
        "cuda_runtime",
        "cuda_driver",
        "mtia_runtime",
        "privateuse1_runtime",
        "privateuse1_driver",
        "xpu_runtime",
        "xpu_driver",
    }
)
# Ranges on no chip: the profiler's window, annotations and profiler ranges on the device
# timeline (HTA leaves them out of kernel time too).
FREE_CATS = frozenset({"gpu_user_annotation", "Trace", "cuda_profiler_range", "cuda_event"})
# Host work by name: anything else is stored as host work and counted as unrecognised.
HOST_CATS = frozenset(
    {
        "cpu_op",
        "python_function",
        "cpu_instant_event",
        "overhead",
        "external_correlation",
        "collective_comm",
        "glow_runtime",
        "mtia_insight",
        "hpu_op",
        "xpu_scope_profiler",
    }
)
# What a category is to the mapping; annotations may be profiler steps.
HOST, LAUNCH, DEVICE, FREE, ANNOTATION = 0, 1, 2, 3, 4


def canonical(cat: str) -> str:
    """The current libkineto name of a category of any profiler generation."""
    return _ALIASES.get(cat, cat)


def category_class(cat: str) -> int:
    cat = canonical(cat)
    if cat in DEVICE_CATS:
        return DEVICE
    if cat in LAUNCH_CATS:
        return LAUNCH
    if cat in FREE_CATS:
        return FREE
    return ANNOTATION if cat == "user_annotation" else HOST


def unrecognised(categories: dict[str, int]) -> dict[str, int]:
    """The categories (and their span counts) no generation of the profiler names: stored
    as host work on cpu:0, which the import summary and manifest say."""
    known = DEVICE_CATS | LAUNCH_CATS | FREE_CATS | HOST_CATS | {"user_annotation"}
    return {c: n for c, n in sorted(categories.items()) if canonical(c) not in known}
