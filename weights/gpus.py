"""Accelerator figures for capacity planning: memory, bandwidth, dense peak FLOP/s, NVLink domain.

Every figure comes from the vendor's datasheet or product brief named in ``source`` (with its
date). Vendors print tensor-core peaks *with 2:4 structured sparsity*; the dense figures used
here are those divided by two, as the datasheets' footnotes say. Memory is in decimal bytes
(``80 GB`` = 80 x 10^9), as the vendors print it; bandwidth in bytes per second.

``nvlink_domain`` is the number of GPUs of one node that share an all-to-all NVLink/NVSwitch
(or AMD Infinity Fabric) fabric: 8 on HGX/DGX and MI300X platforms, 2 for PCIe cards paired
by an NVLink bridge, 1 for cards without a GPU-to-GPU link. Tensor parallelism is kept inside
one domain. The table is reproduced with sources and dates in ``docs/weights.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from weights.errors import SizingError

_GB = 1000**3
_TB = 1000**4
_T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type.

    Attributes:
        name: Table key (``h100-sxm``) or ``custom``.
        memory_bytes: Device memory, bytes (decimal, as the vendor prints it).
        bandwidth_bytes_s: Peak device-memory bandwidth, bytes/s.
        bf16_flops: Dense BF16 tensor peak, FLOP/s.
        fp8_flops: Dense FP8 tensor peak, FLOP/s; None if the GPU has no FP8 tensor cores
            (FP8 weights are then up-cast and computed at the BF16 rate).
        nvlink_domain: GPUs sharing one NVLink / Infinity Fabric domain (1 = none).
        gpu_resource: Kubernetes extended resource name of the device plugin.
        source: Vendor document the figures come from.
        date: Date of that document's version (``YYYY-MM``); ``*``: the document carries no
            date and this is the product's launch month.
    """

    name: str
    memory_bytes: int
    bandwidth_bytes_s: float
    bf16_flops: float
    fp8_flops: float | None
    nvlink_domain: int
    gpu_resource: str
    source: str
    date: str

    def peak_flops(self, dtype_bytes: float) -> float:
        """Dense peak FLOP/s for weights of ``dtype_bytes`` bytes (<= 1: FP8 rate if any)."""
        if dtype_bytes <= 1 and self.fp8_flops is not None:
            return self.fp8_flops
        return self.bf16_flops


_NV = "nvidia.com/gpu"
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet "
         "(nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), SXM column")
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100)"

#: Built-in accelerator table (immutable). Keys are what ``--gpu`` accepts.
GPUS: Mapping[str, GpuSpec] = MappingProxyType({
    "a100-40gb": GpuSpec("a100-40gb", 40 * _GB, 1.555 * _TB, 312 * _T, None, 8, _NV,
                         _A100, "2020-05*"),
    "a100-80gb": GpuSpec("a100-80gb", 80 * _GB, 2.039 * _TB, 312 * _T, None, 8, _NV,
                         _A100, "2020-11*"),
    "h100-sxm": GpuSpec("h100-sxm", 80 * _GB, 3.35 * _TB, 989 * _T, 1979 * _T, 8, _NV,
                        _H100 + ", H100 SXM column", "2022-09*"),
    "h100-pcie": GpuSpec("h100-pcie", 80 * _GB, 2.0 * _TB, 756 * _T, 1513 * _T, 2, _NV,
                         _H100 + ", H100 PCIe column; H100 PCIe product brief "
                         "PB-11133-001_v02 (NVLink bridge pairs)", "2022-11"),
    "h200": GpuSpec("h200", 141 * _GB, 4.8 * _TB, 989 * _T, 1979 * _T, 8, _NV,
                    "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200)"
                    ", H200 SXM column", "2023-11*"),
    "b200": GpuSpec("b200", 180 * _GB, 8.0 * _TB, 2250 * _T, 4500 * _T, 8, _NV,
                    "NVIDIA DGX B200 datasheet (1,440 GB and 64 TB/s over 8 GPUs; 72 PFLOPS "
                    "FP8 sparse) and NVIDIA Blackwell architecture technical brief (HGX B200, "
                    "1000 W: 2.25 PFLOPS dense BF16)", "2024-03*"),
    "l40s": GpuSpec("l40s", 48 * _GB, 864 * _GB, 362.05 * _T, 733 * _T, 1, _NV,
                    "NVIDIA L40S GPU datasheet (PCIe Gen4, no NVLink)", "2023-08*"),
    "mi300x": GpuSpec("mi300x", 192 * _GB, 5.3 * _TB, 1307.4 * _T, 2614.9 * _T, 8,
                      "amd.com/gpu",
                      "AMD Instinct MI300X accelerator data sheet (amd.com; 8-GPU Infinity "
                      "Fabric platform)", "2023-12*"),
})


def gpu_spec(name: str) -> GpuSpec:
    """Look up a built-in GPU type (case-insensitive; ``_`` and ``-`` are equivalent).

    Raises:
        SizingError: Unknown name (the message lists the known ones).
    """
    key = name.strip().lower().replace("_", "-")
    if key not in GPUS:
        raise SizingError(f"unknown GPU type {name!r} (known: {', '.join(GPUS)})",
                          hint="or give its figures: --gpu custom --gpu-mem --gpu-bandwidth "
                               "--gpu-bf16-tflops")
    return GPUS[key]


def custom_gpu(
    *, memory_bytes: int, bandwidth_bytes_s: float, bf16_flops: float,
    fp8_flops: float | None = None, nvlink_domain: int = 1, gpu_resource: str = _NV,
) -> GpuSpec:
    """A GPU described by the operator's own figures (``--gpu custom``).

    Raises:
        SizingError: A figure is not positive.
    """
    for label, v in (("memory", memory_bytes), ("bandwidth", bandwidth_bytes_s),
                     ("BF16 FLOP/s", bf16_flops), ("NVLink domain", nvlink_domain)):
        if not v > 0:
            raise SizingError(f"custom GPU: {label} must be positive, got {v}")
    if fp8_flops is not None and not fp8_flops > 0:
        raise SizingError(f"custom GPU: FP8 FLOP/s must be positive, got {fp8_flops}")
    return GpuSpec("custom", memory_bytes, bandwidth_bytes_s, bf16_flops, fp8_flops,
                   nvlink_domain, gpu_resource, "operator-supplied figures (--gpu-* flags)", "-")


def with_overrides(
    spec: GpuSpec, *, memory_bytes: int | None = None, bandwidth_bytes_s: float | None = None,
    bf16_flops: float | None = None, fp8_flops: float | None = None,
    nvlink_domain: int | None = None,
) -> GpuSpec:
    """``spec`` with some figures replaced by the operator's (source says which)."""
    changed = {k: v for k, v in (("memory_bytes", memory_bytes),
                                 ("bandwidth_bytes_s", bandwidth_bytes_s),
                                 ("bf16_flops", bf16_flops), ("fp8_flops", fp8_flops),
                                 ("nvlink_domain", nvlink_domain)) if v is not None}
    if not changed:
        return spec
    base = custom_gpu(
        memory_bytes=int(changed.get("memory_bytes", spec.memory_bytes)),
        bandwidth_bytes_s=float(changed.get("bandwidth_bytes_s", spec.bandwidth_bytes_s)),
        bf16_flops=float(changed.get("bf16_flops", spec.bf16_flops)),
        fp8_flops=changed.get("fp8_flops", spec.fp8_flops),
        nvlink_domain=int(changed.get("nvlink_domain", spec.nvlink_domain)),
        gpu_resource=spec.gpu_resource)
    return GpuSpec(spec.name, base.memory_bytes, base.bandwidth_bytes_s, base.bf16_flops,
                   base.fp8_flops, base.nvlink_domain, spec.gpu_resource,
                   f"{spec.source}; overridden by flags: {', '.join(sorted(changed))}",
                   spec.date)
