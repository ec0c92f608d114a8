"""Fetch a DurableProducer's rendered Spark pod templates from the cluster (its ConfigMap).

For spark-submit run outside the cluster (a laptop, CI): the templates are read through
the Kubernetes API (kubeconfig, or the in-cluster service account) and written to a local
directory, since Spark needs them as files.
"""

from __future__ import annotations

import os
from pathlib import Path

from durable_producer.contract import SPARK_TEMPLATES_CONFIGMAP_SUFFIX
from durable_producer.spark_integration.conf import (
    PodTemplates,
    TemplateError,
    write_rendered_templates,
)


def templates_configmap_name(producer: str) -> str:
    """Name of the ConfigMap holding the templates rendered for DurableProducer ``producer``."""
    return f"{producer}{SPARK_TEMPLATES_CONFIGMAP_SUFFIX}"


def fetch_rendered_templates(
    configmap: str, namespace: str, *, kubeconfig: Path | None = None
) -> dict[str, str]:
    """The ``data`` of ``configmap`` in ``namespace``; kubeconfig, else in-cluster config."""
    import yaml
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    not_a_kubeconfig = (TypeError, AttributeError, UnicodeDecodeError, yaml.YAMLError)
    named = _kubeconfig_named(kubeconfig)

    # The configuration is filled before the ApiClient exists: the client builds its
    # connection pool (CA, client certificate) from the configuration it is given, so one
    # loaded afterwards is ignored and TLS trusts only the system CAs (NEW-3).
    configuration = client.Configuration()
    try:
        try:
            config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration,
            )
        except (ConfigException, OSError, *not_a_kubeconfig):
            if named is not None:  # its fault is the one to tell, not in-cluster's
                raise
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError, *not_a_kubeconfig) as error:
        reason = (
            "not a kubeconfig (YAML with clusters, contexts and users)"
            if isinstance(error, not_a_kubeconfig)
            else " ".join(str(error).split())
        )
        raise TemplateError(
            f"no usable Kubernetes configuration ({named or 'no kubeconfig, not in a pod'}):"
            f" {reason}; pass --kubeconfig or set KUBECONFIG to a working one"
        ) from error
    configuration.retries = False  # one try within the timeout: urllib3 tried 4 times, 2 min
    api_client = client.ApiClient(configuration=configuration)
    try:
        found = client.CoreV1Api(api_client).read_namespaced_config_map(
            configmap, namespace, _request_timeout=30
        )
    except ApiException as error:
        if not error.status:  # no answer: without retries the client wraps urllib3's SSLError
            raise TemplateError(
                f"cannot reach the Kubernetes API at {configuration.host}:"
                f" {' '.join(str(error.reason).split())}; check the kubeconfig's server and"
                " certificate authority"
            ) from error
        raise TemplateError(
            f"cannot read ConfigMap {namespace}/{configmap} with the Spark pod templates "
            f"({error.status} {error.reason}); is the DurableProducer's Spark template "
            f"rendering enabled and its name right?"
        ) from error
    except HTTPError as error:
        raise TemplateError(
            f"cannot reach the Kubernetes API at {configuration.host}: {error}; "
            "check the kubeconfig's server and certificate authority"
        ) from error
    except (ValueError, TypeError, AttributeError) as error:  # an answer that is no ConfigMap
        raise TemplateError(
            f"{configuration.host} answered with no ConfigMap: is it a Kubernetes API server?"
            " check the kubeconfig's server"
        ) from error
    finally:
        api_client.close()
    return dict(found.data or {})


def _kubeconfig_named(kubeconfig: Path | None) -> str | None:
    """The kubeconfig the client reads when one is given, named by KUBECONFIG (as the client
    read it at import) or present at ~/.kube/config; None: the in-cluster account is next."""
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION as default

    if kubeconfig is not None:
        return f"kubeconfig {kubeconfig}"
    paths = [Path(part).expanduser() for part in default.split(os.pathsep) if part]
    if paths and (default != "~/.kube/config" or any(path.exists() for path in paths)):
        return f"kubeconfig {default}"
    return None  # an empty KUBECONFIG is unset, as kubectl takes it


def fetch_templates(
    configmap: str, namespace: str, directory: Path, *, kubeconfig: Path | None = None
) -> PodTemplates:
    """Fetch the rendered templates and write them into ``directory`` for spark-submit."""
    return write_rendered_templates(
        fetch_rendered_templates(configmap, namespace, kubeconfig=kubeconfig), directory
    )
