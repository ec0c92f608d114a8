{{/*
RBAC rules, kept in one place so that ClusterRole (all namespaces) and Role (watched
namespaces) grant exactly the same verbs. The base rules are the operator's
KUBERNETES_API_ACCESS (src/durable_producer/operator/act/api_access.py), verb for verb; a test keeps
them equal. rbac.features.* add the permissions of optional features, declared in the same
module, flag by flag: FEATURE_API_ACCESS (podAudit, volumePool and drainJobs together are the
volume pool's POOL_API_ACCESS; sparkPodTemplates is SPARK_TEMPLATES_API_ACCESS). The operator is
told the same flags (DURABLE_PRODUCER_FEATURES) and registers only their handlers.
*/}}

{{/*
Cluster-scoped reads, in the ClusterRole whatever namespaces the operator watches (a Role
cannot grant them): kopf discovers resources and follows CRD changes by listing and watching
CustomResourceDefinitions; the volume pool reads StorageClasses to learn whether a volume too
small for its spec can be grown (CLUSTER_FEATURE_API_ACCESS: STORAGE_CLASSES_API_ACCESS), and
the webhook reads the PersistentVolume a free volume is bound to, and the nodes a node-local
PV names, so as not to hand a pod a volume that cannot be attached where it may run
(VOLUME_PLACEMENT_API_ACCESS).
With watchNamespaces, kopf lists and watches Namespaces (their names) to learn which of the
given ones exist; refused, it backs off for about a minute at every start before it handles
anything (NAMESPACE_SCAN_API_ACCESS).
*/}}
{{- define "durable-producer.clusterRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.operator.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- if .Values.rbac.features.volumePool }}
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["persistentvolumes"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
kopf's peering object (CLUSTER_PEERING_API_ACCESS / NAMESPACED_PEERING_API_ACCESS): a
ClusterKopfPeering for a cluster-wide operator (in the ClusterRole), a KopfPeering in each
watched namespace otherwise (in the Roles).
*/}}
{{- define "durable-producer.peeringRules" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ if .Values.operator.watchNamespaces }}"kopfpeerings"{{ else }}"clusterkopfpeerings"{{ end }}]
  verbs: ["list", "watch", "patch"]
{{- end }}

{{/*
Rules in the watched namespaces.
*/}}
{{- define "durable-producer.namespacedRules" -}}
- apiGroups: ["durable.dev"]
  resources: ["durableproducers"]
  verbs: ["list", "watch", "patch"]
- apiGroups: ["durable.dev"]
  resources: ["durableproducers/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- with .Values.rbac.features }}
{{- if .podAudit }}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- end }}
{{- if .sparkPodTemplates }}
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- if .volumePool }}
# Opted-in pods' last status (an agent that stopped with its volume empty), watched.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["list", "get", "create", "patch", "delete"]
- apiGroups: ["durable.dev"]
  resources: ["durableproducers"]
  verbs: ["get"]
{{- end }}
{{- if .drainJobs }}
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["list", "create", "delete"]
{{- end }}
{{- if or .volumePool .drainJobs .sparkPodTemplates }}
# PVCs, drain Jobs and the Spark templates ConfigMap are created with an owner reference that
# sets blockOwnerDeletion: under the OwnerReferencesPermissionEnforcement admission plugin
# that takes update on the owner's finalizers subresource (OWNER_FINALIZERS_ACCESS).
- apiGroups: ["durable.dev"]
  resources: ["durableproducers/finalizers"]
  verbs: ["update"]
{{- end }}
{{- end }}
{{- end }}
