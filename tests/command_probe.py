"""A command for tests/test_commands.py: says what Python gave it, then ends as its arguments ask."""

import json
import os
import sys
import time

print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__, "cwd": os.getcwd(),
                  "compile": os.environ.get("POPULATION_COMPILE"), "name": __name__,
                  "stdin": sys.stdin.read(), "torch_already_imported": "torch" in sys.modules}))
print("to stderr\r\nline", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised by the command")
if sys.argv[1:] == ["sleep"]:
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1:] else 0)
