{{- /* Rights on LabRuns and their events: a ClusterRole when the operator watches every
       namespace, a Role in operator.watchNamespace otherwise. */}}
{{- define "iblab.labrunRules" }}
# LabRuns: the operator's work list (read and watch), their finalizer (patch of
# metadata.finalizers) and their status (the run's phase and verdicts).
- apiGroups: [iblab.dev]
  resources: [labruns]
  verbs: [get, list, watch, patch]
- apiGroups: [iblab.dev]
  resources: [labruns/status]
  verbs: [patch]
# Only authorized, never called: OwnerReferencesPermissionEnforcement asks for update of
# labruns/finalizers when an object the operator makes blocks a LabRun's deletion.
- apiGroups: [iblab.dev]
  resources: [labruns/finalizers]
  verbs: [update]
# Events on LabRuns; patch because kube-runtime's recorder counts a repeated event on one
# object (an event series) instead of making a new one.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}

{{- /* Rights a run needs in the namespace its lab runs in (pods, exec, its ConfigMaps and
       NetworkPolicy): with operator.labRights=perNamespace a ClusterRole bound only where
       a RoleBinding grants it (`iblab class apply` makes one per student namespace). */}}
{{- define "iblab.labRules" }}
# The child `iblab up --backend kube --namespace <LabRun's namespace>`: one pod per lab
# node and switch (created, never changed: no patch; watched until Running; deleted at
# the end, by label: deletecollection). The ValidatingAdmissionPolicy
# <fullname>-operator-pods admits only lab pods (operator.podPolicy).
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, watch, delete, deletecollection]
# Every lab command runs through the API's exec: a websocket upgrade is a GET (get), and
# recent API servers ask create for it as well (as SPDY always did).
- apiGroups: [""]
  resources: [pods/exec]
  verbs: [create, get]
# The run's anchor ConfigMap (owner of its pods) and <labrun>-evidence (evidence.json,
# junit.xml, report.html).
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, list, watch, patch, delete]
# The run's NetworkPolicy (its pods take traffic only from one another), owned by its
# anchor: created before the pods, collected with the anchor.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, delete]
{{- end }}
