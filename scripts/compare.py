#!/usr/bin/env python
"""Print the book's output beside one or more chapter runs: compare.py OUT_DIR [OUT_DIR ...]."""

import argparse
import json
import os
import sys

from d2l_transformer.book import compare_table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("runs", nargs="+", help="directories holding a summary.json")
    args = p.parse_args(argv)
    runs = []
    for d in args.runs:
        path = os.path.join(d, "summary.json")
        try:
            with open(path, encoding="utf-8") as f:
                s = json.load(f)
        except (OSError, ValueError) as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
        runs.append(("exact chapter" if s.get("exact_chapter") else "corrected", s))
    print(compare_table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
