"""A rank of the 2-process jobs of ``tests/test_background_write.py``: each rank writes a
checkpoint in the background, rank 0's write fails, and which ranks wait on the write is
given; the rank records what it was told (:meth:`BackgroundWrite.finish` with the job's
agreement) in ``OUT/rank<R>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from ptrain import CheckpointWriteError
from ptrain.background_write import BackgroundWrite, HostBuffers, WriteAgreement


def main(rank: int, out: str, listening: list[int]) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(str(Path(out) / "store"), 2),
                            rank=rank, world_size=2)
    try:
        heard: list[str] = []

        def refuse() -> None:
            raise CheckpointWriteError("could not write checkpoint 'a.ckpt': no space left")

        write = BackgroundWrite(3, HostBuffers())
        write.begin_part()
        write.add(refuse if rank == 0 else (lambda: None))
        if rank in listening:
            write.then(lambda error: heard.append(type(error).__name__))
        error = write.finish(WriteAgreement().agreed_outcome)
        Path(out, f"rank{rank}.json").write_text(json.dumps({
            "error": type(error).__name__, "heard": heard,
            "unheard": None if write.unheard_error is None else str(write.unheard_error)}))
        dist.barrier()  # leave together: gloo aborts a process whose peer tore down first
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]))
