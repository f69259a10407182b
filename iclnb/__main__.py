"""``python -m iclnb``: the command line of the book (:mod:`iclnb.bookkit.cli`)."""

from iclnb.bookkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
