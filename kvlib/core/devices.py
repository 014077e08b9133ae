"""Published peak FLOP/s and memory bandwidth of GPUs: the roofs of notebook 05's roofline.

Dense figures from NVIDIA's datasheets and whitepapers (tensor FLOP/s without 2:4 sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Device:
    """Peak FLOP/s and memory bandwidth (bytes/s) of one device; ridge points follow from them."""

    name: str
    fp32_flops: float  # dense FP32, FLOP/s
    tensor16_flops: float  # dense 16-bit tensor-core FLOP/s (BF16, or FP16 where no BF16)
    bandwidth: float  # bytes/s
    memory: float  # bytes of device memory: weights and KV cache must fit in it
    memory_type: str  # what the bandwidth is of: HBM (stacked beside the chip) or GDDR (chips on the board)
    source: str
    note: str = ""

    def peak_flops(self, dtype: torch.dtype = torch.float16) -> float:
        """FP32 peak for float32, the tensor-core peak for 16-bit types."""
        return self.fp32_flops if dtype == torch.float32 else self.tensor16_flops

    def ridge(self, dtype: torch.dtype = torch.float16) -> float:
        """FLOPs per byte at which the roofline turns: left of it, memory sets the time."""
        return self.peak_flops(dtype) / self.bandwidth


_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
TERA, GIGA = 1e12, 1e9  # FLOP/s and bytes/s in the units datasheets print
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "T4",
            8.1 * TERA,
            65 * TERA,
            320 * GIGA,
            16 * GIGA,
            "GDDR6",
            "NVIDIA T4 datasheet",
            "16-bit is FP16: no BF16",
        ),
        Device("L4", 30.3 * TERA, 121 * TERA, 300 * GIGA, 24 * GIGA, "GDDR6", "NVIDIA L4 datasheet"),
        Device("A100 40GB SXM", 19.5 * TERA, 312 * TERA, 1555 * GIGA, 40 * GIGA, "HBM2", _A100),
        Device(
            "A100 80GB PCIe",
            19.5 * TERA,
            312 * TERA,
            1935 * GIGA,
            80 * GIGA,
            "HBM2e",
            _A100,
            "the '~1.9 TB/s' of the article 'KV Cache：以空间换时间' (CSDN)",
        ),
        Device("A100 80GB SXM", 19.5 * TERA, 312 * TERA, 2039 * GIGA, 80 * GIGA, "HBM2e", _A100),
        Device("H100 SXM", 67 * TERA, 989 * TERA, 3350 * GIGA, 80 * GIGA, "HBM3", _H100),
        Device("H100 PCIe", 51 * TERA, 756 * TERA, 2000 * GIGA, 80 * GIGA, "HBM2e", _H100),
        Device(
            "H200 SXM",
            67 * TERA,
            989 * TERA,
            4800 * GIGA,
            141 * GIGA,
            "HBM3e",
            "NVIDIA H200 datasheet (compute as H100 SXM)",
        ),
        Device(
            "RTX 4090",
            82.6 * TERA,
            165 * TERA,
            1008 * GIGA,
            24 * GIGA,
            "GDDR6X",
            "NVIDIA Ada (RTX 4090) whitepaper",
            "16-bit with FP32 accumulate",
        ),
    )
}
