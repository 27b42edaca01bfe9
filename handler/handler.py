"""Runpod entry point: `python handler/handler.py [--rp_serve_api ...]` is `warmstart serve`.

The worker lives in the `warmstart` package; this file only exists where Runpod's
templates and tooling look for a handler.
"""

import sys

from warmstart.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
