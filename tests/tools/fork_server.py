"""Start test programs as forks of one process that has imported handrail already (forks.py).

    python fork_server.py MODULE...      # imports the modules, then serves stdin

A Python process that imports handrail spends ~0.5 s of CPU on it before doing anything; the
kill tests start ~100 of them. This server pays that once: for each request (one JSON line on
stdin: `{"script": PATH, "argv": [...], "env": {...}, "out": PATH, "err": PATH}`) it forks a
child that runs the script as `__main__` with that argv and environment, its stdout and stderr
in the two files, and answers `{"pid": N}` at once, then `{"code": C}` once the child has
ended (C as `Popen.returncode` says it: negative for the signal that killed it). Each child is
a process of its own, with the memory of a process that has only imported modules: whatever a
test kills or resumes in it is as fresh as in a new interpreter.

Single-threaded, no event loop while it forks. It exits when stdin closes.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import traceback


def _child(request: dict[str, object]) -> None:
    try:
        for name, fd in (("out", 1), ("err", 2)):
            target = os.open(str(request[name]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        env = request.get("env") or {}
        assert isinstance(env, dict)
        os.environ.update({str(k): str(v) for k, v in env.items()})
        script = str(request["script"])
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = [script, *map(str, argv)]
        sys.path[0] = os.path.dirname(script)
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), file=answers,
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
