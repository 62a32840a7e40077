"""The manifest: `handrail.toml`, its canonical digest, and the drift check (stage 2 of the gate).

The manifest is the reviewable statement of what an agent may reach and what the model is
told, and it stays the authority: `check_against` refuses code that has drifted from it, and
`Manifest.offer` shows the model exactly the granted tools with the reviewed descriptions.
The file format and the canonical form are documented in docs/manifest.md.
"""

from handrail.manifest._check import (
    Problem,
    Severity,
    agent_problems,
    check_against,
    problems,
    refusals,
    review,
    schema_changes,
)
from handrail.manifest._manifest import (
    CANONICAL_FORMAT,
    AgentSection,
    Budgets,
    ControlSection,
    Grant,
    Manifest,
    canonical_json,
)
from handrail.manifest._servers import ArgumentAction, ServerDecl
from handrail.manifest._update import update

__all__ = [
    "CANONICAL_FORMAT",
    "AgentSection",
    "ArgumentAction",
    "Budgets",
    "ControlSection",
    "Grant",
    "Manifest",
    "Problem",
    "ServerDecl",
    "Severity",
    "agent_problems",
    "canonical_json",
    "check_against",
    "problems",
    "refusals",
    "review",
    "schema_changes",
    "update",
]
