"""The shipped CRDs on the real API server (kube-apiserver v1.35), as users apply them."""

from __future__ import annotations

import pytest

from support.kube_cluster import CRDS_DIR, NEW_1, Cluster

pytestmark = pytest.mark.integration


@pytest.mark.xfail(strict=True, reason=NEW_1)
def test_the_shipped_crds_are_accepted_by_kubectl_apply(control_plane: Cluster) -> None:
    result = control_plane.kubectl("apply", "--server-side", "--dry-run=server",
                                   "--force-conflicts", "-f", str(CRDS_DIR), check=False)

    assert result.returncode == 0, result.stderr
