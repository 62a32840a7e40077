"""Path confinement, as the policy uses it: the canonical-path functions of the tool layer.

Canonicalising a path against the workspace is needed twice: by the policy (stage 5, to match
the canonical form) and by the tool layer at the moment of use (a `hr.ReadPath` argument is
bound to exactly the path that was decided). It lives in the lower floor,
`handrail.tools._workspace`, and is re-exported here so `handrail.policy` keeps offering it.
"""

from handrail.tools import (
    PATH_MAX,
    OutsideWorkspace,
    UncanonicalPath,
    UncanonicalTarget,
    canonical_path,
    canonicalize,
    resolve_in_workspace,
    workspace_root,
)

__all__ = [
    "PATH_MAX",
    "OutsideWorkspace",
    "UncanonicalPath",
    "UncanonicalTarget",
    "canonical_path",
    "canonicalize",
    "resolve_in_workspace",
    "workspace_root",
]
