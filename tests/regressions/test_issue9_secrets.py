"""Issue 9 §6: the secrets layer covers the common credential files, at any depth and case."""

from __future__ import annotations

from pathlib import Path

import pytest

import handrail as hr
from handrail.policy import Effect, Policy

NEW = ["id_ecdsa", "id_dsa", ".npmrc", ".pypirc", ".aws/credentials", ".docker/config.json",
       ".kube/config", "cert.p12", "cert.pfx", "id_ecdsa_sk", "id_ed25519_sk", ".git-credentials"]


@pytest.mark.parametrize("secret", NEW)
@pytest.mark.parametrize("act", [hr.Act.READ, hr.Act.WRITE])
def test_credential_files_are_denied_at_any_depth(tmp_path: Path, secret: str,
                                                  act: hr.Act) -> None:
    policy = Policy.default()
    for target in (secret, f"home/me/{secret}", secret.upper()):
        v = policy.check(hr.Action(act, target), workspace=tmp_path)
        assert (v.effect, v.layer) == (Effect.DENY, "secrets"), target


@pytest.mark.parametrize("near", [".aws/config", "docker/config.json", "kube/config",
                                  "id_ecdsa.pub", "notes.p12.txt", ".npmrc.example"])
def test_near_misses_stay_readable(tmp_path: Path, near: str) -> None:
    assert Policy.default().check(hr.Action(hr.Act.READ, near),
                                  workspace=tmp_path).effect is Effect.ALLOW
