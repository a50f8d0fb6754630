"""Block files of the KV cache's disk tier (core/disk_tier.py decides, this stores).

One file per slot, `<root>/cadence-kv-<pid>-<random>/<slot>.kv`, holding one block of every
layer's K and V as raw bytes ([num_layers, 2, block_size, num_kv_heads, head_dim] in the cache
dtype). The subdirectory is this engine's alone: it is removed at close (and at interpreter
exit), and directories of engines whose process is gone are removed at start, so a crash does
not leave the disk filling up across restarts. A slot is readable only after this store wrote
it successfully: a failed or partial write, a missing or short file all raise OSError, never
return stale bytes (the caller then recomputes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import torch

_PREFIX = "cadence-kv-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_dirs(root: str) -> int:
    """Remove the block directories of engines whose process no longer runs; returns how many."""
    removed = 0
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(_PREFIX):
            continue
        pid_text = name[len(_PREFIX):].split("-", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed += 1
    return removed


class DiskKVStore:
    """Write / read / delete block files by slot id."""

    def __init__(self, root: str, block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        os.makedirs(root, exist_ok=True)
        remove_stale_dirs(root)
        self.dir = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=root)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.dir, ignore_errors=True)
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        self.block_nbytes = torch.empty(self.block_shape, dtype=dtype).nbytes
        self._valid: set[int] = set()

    def path(self, slot: int) -> str:
        return os.path.join(self.dir, f"{slot}.kv")

    @property
    def num_files(self) -> int:
        return len(self._valid)

    def write(self, slot: int, block: torch.Tensor) -> None:
        """Store one block ([L, 2, block_size, H_kv, D], on the host). Raises OSError (disk
        full, ...) after removing whatever was there: the slot then reads as missing."""
        self._valid.discard(slot)
        path = self.path(slot)
        tmp = path + ".tmp"
        data = block.contiguous().view(torch.uint8).reshape(-1).numpy()
        try:
            with open(tmp, "wb") as f:
                f.write(memoryview(data))
            os.replace(tmp, path)
        except OSError:
            for p in (tmp, path):
                try:
                    os.unlink(p)
                except OSError:
                    pass
            raise
        self._valid.add(slot)

    def read(self, slot: int) -> torch.Tensor:
        """One block back ([L, 2, block_size, H_kv, D]). Raises OSError when the slot was not
        written by this store or its file is missing, short or long."""
        if slot not in self._valid:
            raise OSError(f"disk slot {slot} holds no block written by this engine")
        buf = torch.empty(self.block_nbytes, dtype=torch.uint8)
        with open(self.path(slot), "rb") as f:
            n = f.readinto(buf.numpy())
            extra = f.read(1)
        if n != self.block_nbytes or extra:
            raise OSError(f"disk slot {slot}: file has the wrong size")
        return buf.view(self.dtype).reshape(self.block_shape)

    def discard(self, slot: int) -> None:
        self._valid.discard(slot)
        try:
            os.unlink(self.path(slot))
        except OSError:
            pass

    def close(self) -> None:
        """Delete every block file and the directory."""
        self._valid.clear()
        self._finalizer()
