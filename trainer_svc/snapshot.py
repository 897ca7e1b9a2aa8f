"""One version's weights copied into host buffers, for the publisher to send to the relay.

On the CPU a snapshot is a plain copy into buffers of the same shapes. On a GPU the buffers
are pinned and the copy runs on the snapshot's own CUDA stream, off the training stream: it
first waits for the event `ready_event` recorded when the version was published (so it reads
the weights the optimizer step left, not ones still being written), then copies every tensor
without blocking and synchronizes only its own stream. Meanwhile the training stream runs the
next step's forward and backward passes, which only read the weights; the publisher's
`fence` holds the next optimizer step until the copy is done.

With a `dtype` (model.dtype, e.g. bfloat16) the buffers of floating-point weights are in it
and the copy casts: the trainer's master weights stay float32, the version is shipped in the
model's dtype at no extra pass.
"""

from __future__ import annotations

import torch


def ready_event(state: dict[str, torch.Tensor]) -> torch.cuda.Event | None:
    """On the caller's (training) thread: an event marking the point on the current CUDA
    stream after which `state` holds the version being published; None for CPU weights."""
    device = _cuda_device(state)
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


class Snapshot:
    def __init__(self, dtype: torch.dtype | None = None):
        self.dtype = dtype  # of floating-point weights; None: as they are
        self.buffers: dict[str, torch.Tensor] = {}
        self.version = 0
        self.step = 0
        self._stream: torch.cuda.Stream | None = None

    def fill(self, version: int, step: int, state: dict[str, torch.Tensor],
             ready: torch.cuda.Event | None = None) -> None:
        device = _cuda_device(state)
        if device is None:
            # One call for every tensor: the GIL stays released for the whole copy instead of
            # being taken back between tensors, where the send thread's Python holds it up.
            torch._foreach_copy_([self._buffer(name, t, pin=False) for name, t in state.items()],
                                 [t.detach() for t in state.values()])
        else:
            if self._stream is None or self._stream.device != device:
                self._stream = torch.cuda.Stream(device)
            with torch.cuda.stream(self._stream):
                if ready is not None:
                    self._stream.wait_event(ready)
                for name, t in state.items():
                    self._buffer(name, t, pin=True).copy_(t.detach(), non_blocking=True)
            self._stream.synchronize()
        self.version, self.step = version, step

    def _buffer(self, name: str, like: torch.Tensor, pin: bool) -> torch.Tensor:
        """The host buffer for `name`, allocated once per shape and dtype (pinned memory
        is slow to allocate: the two snapshots' buffers are reused every version)."""
        dtype = self.dtype if self.dtype is not None and like.is_floating_point() \
            else like.dtype
        buf = self.buffers.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != dtype \
                or (pin and not buf.is_pinned()):
            buf = self.buffers[name] = torch.empty(like.shape, dtype=dtype, pin_memory=pin)
        return buf

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())


def _cuda_device(state: dict[str, torch.Tensor]) -> torch.device | None:
    return next((t.device for t in state.values() if t.is_cuda), None)
