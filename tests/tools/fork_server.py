"""Start test programs as forks of one process that has imported handrail already (forks.py).

    python fork_server.py MODULE...      # imports the modules, then serves stdin

A Python process that imports handrail spends ~0.5 s of CPU on it before doing anything; the
kill tests start ~100 of them. This server pays that once: for each request (one JSON line on
stdin: `{"script": PATH or "module": NAME or "code": TEXT, "argv": [...], "env": {...},
"replace_env": BOOL, "cwd": PATH, "out": PATH, "err": PATH}`) it forks a child that runs the
script, or the module as `python -m` does, or the code as `python -c` does, as `__main__`:
with that argv, that environment (added to the server's, or in place of it; its PYTHONPATH put
on the path as a new interpreter would), that working
directory, stdin at /dev/null, stdout and stderr in the two files. It answers `{"pid": N}`
at once, then `{"code": C}` once the child has ended (C as `Popen.returncode` says it:
negative for the signal that killed it). Each child is
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
from typing import Any


def _child(request: dict[str, Any]) -> int:
    """Become the program of `request`; its exit code (the interpreter then exits as usual:
    atexit handlers, non-daemon threads, flushed files)."""
    try:
        for name, fd in (("out", 1), ("err", 2)):
            target = os.open(str(request[name]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        if request.get("cwd"):
            os.chdir(str(request["cwd"]))
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        if request.get("replace_env"):
            os.environ.clear()
        os.environ.update(env)
        # What a new interpreter would have made of the environment it is given.
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        argv = [str(a) for a in request["argv"]]
        if request.get("code"):
            # `python -c CODE`: the working directory first on the path (as "").
            sys.path[:1] = ["", *extra]
            sys.argv = ["-c", *argv]
            exec(compile(str(request["code"]), "<string>", "exec"), {"__name__": "__main__"})
        elif request.get("module"):
            # `python -m MODULE`: the working directory first on the path.
            sys.path[:1] = [os.getcwd(), *extra]
            sys.argv = [str(request["module"]), *argv]
            runpy.run_module(str(request["module"]), run_name="__main__", alter_sys=True)
        else:
            script = str(request["script"])
            sys.path[:1] = [os.path.dirname(os.path.abspath(script)), *extra]
            sys.argv = [script, *argv]
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def main(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            sys.exit(_child(request))
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), file=answers,
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
