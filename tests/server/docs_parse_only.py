"""Run each given program (a script path or a module) up to its argument parsing, then stop:
the flags a page documents are checked by the program's own argparse parser, without running
the benchmark behind it. One process for all of them (torch is imported once).

    python docs_parse_only.py '[["path", "benchmarks/x.py", "--flag", "1"], ["module", "m"]]'
prints {command: "ok" | "exit 2" | "<exception>" | "ran without parsing arguments"}.
"""

import argparse
import json
import os
import runpy
import sys

class Parsed(Exception):
    pass

_orig = argparse.ArgumentParser.parse_args

def _parse_then_stop(self, args=None, namespace=None):
    _orig(self, args, namespace)
    raise Parsed()

argparse.ArgumentParser.parse_args = _parse_then_stop
results = {}
for command in json.loads(sys.argv[1]):
    kind, target, *flags = command
    sys.argv = [target, *flags]
    try:
        if kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(target)))  # as `python FILE`
            runpy.run_path(target, run_name="__main__")
        results[" ".join(command)] = "ran without parsing arguments"
    except Parsed:
        results[" ".join(command)] = "ok"
    except SystemExit as exc:
        results[" ".join(command)] = f"exit {exc.code}"
    except Exception as exc:
        results[" ".join(command)] = f"{type(exc).__name__}: {exc}"
print(json.dumps(results))
