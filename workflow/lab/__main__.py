"""python -m lab <command>: the lab's command line (status: which tables of a run are out of date)."""
import os
import sys

from . import status

COMMANDS = {"status": status.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m lab {{{'|'.join(COMMANDS)}}} ...")
    try:
        code = COMMANDS[sys.argv[1]](sys.argv[2:])
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped (| head): no traceback, and nothing more to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
