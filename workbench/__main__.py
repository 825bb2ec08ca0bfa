"""``python -m workbench``: the command line of workbench.cli."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
