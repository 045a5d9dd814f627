"""``ptrain-consolidate SRC DST`` (or ``python -m ptrain_fsdp.consolidate``): a sharded checkpoint
folder into one file (see :func:`ptrain_fsdp.checkpoint.consolidate`)."""

from __future__ import annotations

import argparse
import sys

from ptrain import PtrainError
from ptrain_fsdp.checkpoint import consolidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ptrain-consolidate",
        description="Turn a sharded ptrain checkpoint folder (fsdp, zero2, zero3) into one file.")
    parser.add_argument("src", help="the sharded checkpoint folder, e.g. runs/version_0/"
                                    "checkpoints/last.ckpt")
    parser.add_argument("dst", help="the single-file checkpoint to write")
    args = parser.parse_args(argv)
    try:
        consolidate(args.src, args.dst)
    except PtrainError as exc:
        print(f"ptrain-consolidate: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
