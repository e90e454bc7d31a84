"""Run by tests/project/test_zygote.py as a zygote child: prints what it was given
(argv, working directory, one environment variable) as JSON and exits with status 7."""

import json
import os
import sys

print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                  "probe": os.environ.get("PP1Q_ZYGOTE_PROBE")}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(7)
