"""python -m lab <command>: the lab's command line (status: which tables of a run are out of date)."""
import os
import sys

from . import status

COMMANDS = {"status": status.main}

if __name__ == "__main__":
    usage = f"usage: python -m lab {{{'|'.join(COMMANDS)}}} ...  (python -m lab status --help: its arguments)"
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.split(":", 1)[1].strip(), usage, sep="\n")
        sys.exit(0)
    if sys.argv[1:2] == [] or sys.argv[1] not in COMMANDS:
        problem = f"unknown command {sys.argv[1]!r}" if sys.argv[1:2] else "no command"
        print(f"python -m lab: {problem} (commands: {', '.join(COMMANDS)})\n{usage}", file=sys.stderr)
        sys.exit(2)
    try:
        code = COMMANDS[sys.argv[1]](sys.argv[2:])
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped (| head): no traceback, and nothing more to write
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)
