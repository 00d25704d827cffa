"""A command for tests/test_commands.py: says what Python gave it, then ends as its arguments ask."""

GIVEN = sorted(name for name in globals() if not name.startswith("__"))  # before any import: nothing

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "cwd": os.getcwd(), "given": GIVEN,
                  "compile": os.environ.get("POPULATION_COMPILE"), "name": __name__, "stdin": sys.stdin.read(),
                  "pid": os.getpid(), "torch_already_imported": "torch" in sys.modules}), flush=True)
print("to stderr\r\nline", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised by the command")
if sys.argv[1:] == ["sleep"]:
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
