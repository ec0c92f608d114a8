"""How the operator logs in to the Kubernetes API, and the one line it says when it cannot.

In a pod the operator uses its ServiceAccount; outside one (development, docs/operator.md) the
kubeconfig's current context: kopf's own ``login_via_client`` does both. Left to kopf, a
kubeconfig it cannot use (a typo in its YAML, a context naming no cluster, none at all) was
logged as three tracebacks, some 190 lines, and the process then ended with kopf's own
(exit code 1). Here such a login stops the operator with one ERROR line saying what was wrong
and what to do, and exit code ``LOGIN_FAILED_EXIT``, before kopf watches or serves anything
(the login comes after the startup handler, before the watches and the webhook server).

An API server that is there but does not answer is no login failure: kopf retries it (a
restarting control plane must not stop the operator).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import kopf

LOGIN_FAILED_EXIT = 2
"""The operator's exit code when it has no usable credentials (docs/operator.md)."""
DEFAULT_KUBECONFIG = "~/.kube/config"


def log_in(logger: kopf.Logger, settings: kopf.OperatorSettings) -> kopf.ConnectionInfo | None:
    """kopf's client login; on failure one line, and the process ends at once with
    ``LOGIN_FAILED_EXIT``: a ``SystemExit`` left kopf's tasks to be torn down half-way, which
    printed tracebacks of their own, some runs and not others."""
    try:
        return kopf.login_via_client(logger=logger, settings=settings)
    except Exception as error:  # whatever the kubeconfig's loader raised: said in one line
        logger.error("%s", login_problem(error, os.environ))
        logging.shutdown()  # the line written out; nothing else holds state yet
        os._exit(LOGIN_FAILED_EXIT)


def login_problem(error: BaseException, environ: Mapping[str, str]) -> str:
    """One line: the kubeconfig tried, what was wrong with it, what to do."""
    cause = error.__cause__ or error.__context__ if isinstance(error, kopf.LoginError) else None
    what = " ".join(str(cause or error).split()) or type(error).__name__
    named = environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    paths = [Path(path).expanduser() for path in named.split(os.pathsep) if path]
    where = ", ".join(map(str, paths))
    if paths and not any(path.exists() for path in paths):
        what = "no such file"
    return (
        f"cannot log in to the Kubernetes API: not in a pod (no ServiceAccount token), and the"
        f" kubeconfig {where} cannot be used: {what}; fix it, or point KUBECONFIG at a working"
        f" one (kubectl config view --minify shows what kubectl would use)"
    )
