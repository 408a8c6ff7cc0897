"""A TorchScript archive that writes a file when it is loaded, for the tests of README
"Security": its scripted __setstate__ maps MARKER (created, 16 bytes) with torch.from_file,
which runs inside torch.jit.load, and so inside torch.load(weights_only=True) too (it
hands TorchScript archives to torch.jit.load) and LibTorch's torch::jit::load.

    payloads.py MARKER OUT     (run with /usr/bin/python3)
"""

import sys
from typing import Tuple

import torch


class WritesOnLoad(torch.nn.Module):
    def __init__(self, marker: str):
        super().__init__()
        self.marker = marker
        self.x = torch.zeros(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.x

    @torch.jit.export
    def __getstate__(self) -> Tuple[str, torch.Tensor, bool]:
        return (self.marker, self.x, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[str, torch.Tensor, bool]) -> None:
        # The mapped tensor must stay in use: TorchScript drops a result nothing reads.
        t = torch.from_file(state[0], True, 16, dtype=torch.uint8)
        self.x = t.float()
        self.marker = state[0]
        self.training = state[2]


def write(marker, out):
    torch.jit.save(torch.jit.script(WritesOnLoad(marker)), out)


if __name__ == "__main__":
    write(sys.argv[1], sys.argv[2])
