"""python -m lab <command>: the lab's command line (status: which tables of a run are out of date)."""
import sys

from . import status

COMMANDS = {"status": status.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m lab {{{'|'.join(COMMANDS)}}} ...")
    sys.exit(COMMANDS[sys.argv[1]](sys.argv[2:]))
