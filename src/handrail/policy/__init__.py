r"""Deciding what a call may touch: stage 5 of the gate (see docs/policy.md).

A call's actions (`Action(act, target, content)`) are checked against a `Policy`: ordered,
named `Layer`s of `Rule`s (act, pattern, effect) plus a default effect per act. Evaluation is
deny-first across every layer, then ask, then allow, then the default; specificity never
matters. `policy.check(action)` returns a `Verdict` naming the deciding rule and layer (None
when the default decided); `policy.explain` is the same function.

Targets are canonicalised before matching; matching sees only the canonical form:

- READ/WRITE: the path resolved against the workspace root (`..`, `.`, `//` collapsed,
  symlinks followed, absolute paths made relative). Outside the workspace, or impossible to
  canonicalise (NUL byte, lone surrogate): Deny, whatever the rules say.
- EXEC: the argv joined by spaces, the program resolved (PATH lookup, or a path normalised
  against the workspace); in deny/ask rules a program word without `/` matches the basename
  of the program as given, resolved or behind a link (`rm` catches `/bin/rm`); in allow rules
  only a program given bare and found on PATH; an absolute one pins it. `*` and `?` cross
  argv words (`git push*` covers `git push origin main`).
- NET: `host:port` and `host`, lower-cased, IPs in standard form (`127.1` is `127.0.0.1`),
  plus the address classes `loopback`, `link-local`, `private` as keywords; CIDR rules.
- Targets are length-capped (a path at PATH_MAX, 4096 bytes) and matching is linear-time.
- CALL: `server/name[/...]`; a pattern also covers targets extending it (`ledger/transfer`
  covers `ledger/transfer/acct-42`).

Patterns: `*` within a segment (any run for EXEC), `**` across segments, `?` one character,
`[a-z]`/`[!a]` one character of a set, `\` escapes. A path pattern without `/` matches the
basename at any depth (`.env` catches `a/b/.env`); a leading `/` anchors it at the workspace
root. Deny and ask
rules match in any letter case (case-insensitive filesystems); allow rules match exactly.
A malformed pattern raises `PolicyError` when the rule is built.

The record of what agents did answers two questions about a policy change (docs/policy.md):
`what_if(store, policy)` replays every recorded call against a proposed policy and reports
what flips (`WhatIf`, `Flip`); `suggest(store)` derives the least policy the record needs
(`Suggestion`). `replay` and `suggest_from` are the same over runs and calls in hand.
"""

from handrail.policy._conditions import Condition
from handrail.policy._limits import Limit, quota_lines
from handrail.policy._paths import (
    PATH_MAX,
    OutsideWorkspace,
    UncanonicalPath,
    UncanonicalTarget,
    canonical_path,
    canonicalize,
    resolve_in_workspace,
    workspace_root,
)
from handrail.policy._policy import CONFINEMENT, SECRETS, Effect, Layer, Policy, Rule, Verdict
from handrail.policy._targets import address_classes, canonical_net, is_inside, resolve_program
from handrail.policy._terms import AskTerms, parse_duration
from handrail.policy._tomltext import MAX_NESTING, too_deep, without_bom
from handrail.policy._whatif import (
    Flip,
    Suggestion,
    WhatIf,
    replay,
    suggest,
    suggest_from,
    what_if,
)
from handrail.tools import Act, Action

__all__ = [
    "CONFINEMENT",
    "MAX_NESTING",
    "PATH_MAX",
    "SECRETS",
    "Act",
    "Action",
    "AskTerms",
    "Condition",
    "Effect",
    "Flip",
    "Layer",
    "Limit",
    "OutsideWorkspace",
    "Policy",
    "Rule",
    "Suggestion",
    "UncanonicalPath",
    "UncanonicalTarget",
    "Verdict",
    "WhatIf",
    "address_classes",
    "canonical_net",
    "canonical_path",
    "canonicalize",
    "is_inside",
    "parse_duration",
    "quota_lines",
    "replay",
    "resolve_in_workspace",
    "resolve_program",
    "suggest",
    "suggest_from",
    "too_deep",
    "what_if",
    "without_bom",
    "workspace_root",
]
