#!/usr/bin/env python
"""Print the book's output beside one or more chapter runs: compare.py OUT_DIR [OUT_DIR ...]."""

import argparse
import sys

from d2l_transformer.book import compare_table, load_run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", help="directories holding a summary.json")
    args = p.parse_args(argv)
    try:
        runs = [load_run(d) for d in args.runs]
    except (OSError, ValueError) as e:
        print(f"error: cannot read a run: {e}", file=sys.stderr)
        return 2
    print(compare_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
