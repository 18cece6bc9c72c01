"""`python -m selfspec.serve MODEL ...` = `selfspec serve MODEL ...` (the flags are selfspec/cli.py's)."""
import sys

from selfspec.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
