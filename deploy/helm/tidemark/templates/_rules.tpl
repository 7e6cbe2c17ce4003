{{- /* The operator's rights where it serves objects: the ClusterRole (every namespace) or
       the Role of each of watchNamespaces. Mirrors tidemark_operator::rbac::rules. */ -}}
{{- define "tidemark.rules" }}
  # Watch the policies, schedules, backups, claim retentions, restores and DeleteHooks (those
  # that apply to a Backup being deleted); write only their status.
  - apiGroups: ["tidemark.io"]
    resources: ["backuppolicies", "scheduledbackups", "backups", "volumeclaimretentions", "restores", "deletehooks"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["tidemark.io"]
    resources:
      - "backuppolicies/status"
      - "scheduledbackups/status"
      - "backups/status"
      - "volumeclaimretentions/status"
      - "restores/status"
      - "deletehooks/status"
    verbs: ["patch"]
  # ScheduledBackups create Backups; the remote-cleanup finalizer is added and removed
  # by patch; a Backup whose ttl ran out is deleted.
  - apiGroups: ["tidemark.io"]
    resources: ["backups"]
    verbs: ["create", "patch", "delete"]
  # An unfinished Restore's finalizer (deleting it stops its Job first), by patch.
  - apiGroups: ["tidemark.io"]
    resources: ["restores"]
    verbs: ["patch"]
  {{- if .Values.capabilities.jobs }}
  # Backups run as Jobs pinned to the database pod's node; consolidations as Jobs, removed
  # once their outcome is read; DeleteHooks with a job action.
  - apiGroups: ["batch"]
    resources: ["jobs"]
    verbs: ["get", "list", "watch", "create", "delete"]
  {{- else }}
  # capabilities.jobs off: Jobs are watched, never created.
  - apiGroups: ["batch"]
    resources: ["jobs"]
    verbs: ["get", "list", "watch"]
  {{- end }}
  {{- if .Values.capabilities.archiver }}
  # One binlog archiver Deployment per BackupPolicy with binlogArchive.server.
  - apiGroups: ["apps"]
    resources: ["deployments"]
    verbs: ["get", "list", "watch", "create", "patch", "delete"]
  {{- else }}
  # capabilities.archiver off: Deployments are watched, never created.
  - apiGroups: ["apps"]
    resources: ["deployments"]
    verbs: ["get", "list", "watch"]
  {{- end }}
  {{- if .Values.capabilities.recreate }}
  # Choosing the database pod; which claims running pods mount (watched, for the PVC
  # reaper); a pending StatefulSet pod whose claim expired is deleted, so that its
  # StatefulSet recreates it on a fresh claim.
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list", "watch", "delete"]
  # Whether such a claim is one of the StatefulSet's volumeClaimTemplates (only those are
  # created anew); a database's pod template while it has no pod (a Restore in place).
  - apiGroups: ["apps"]
    resources: ["statefulsets"]
    verbs: ["get", "list"]
  {{- else }}
  # Choosing the database pod; which claims running pods mount (watched, for the PVC
  # reaper). capabilities.recreate off: never deleted.
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list", "watch"]
  # A database's pod template while it has no pod (a Restore in place).
  - apiGroups: ["apps"]
    resources: ["statefulsets"]
    verbs: ["list"]
  {{- end }}
  # The end of a backup or restore Job's log, kept in its object's status (logTail).
  - apiGroups: [""]
    resources: ["pods/log"]
    verbs: ["get"]
  {{- if .Values.capabilities.exec }}
  # Method exec: the backup command runs in the database container (a websocket exec is
  # a GET up to Kubernetes 1.29, authorized as create from 1.30).
  - apiGroups: [""]
    resources: ["pods/exec"]
    verbs: ["get", "create"]
  {{- end }}
  # Refusing a ReadWriteOncePod data volume; the PVC reaper (VolumeClaimRetention) stamps
  # claims by patch and deletes those unmounted past their TTL; a Restore creates the
  # claim it restores into (newClaim).
  - apiGroups: [""]
    resources: ["persistentvolumeclaims"]
    verbs: ["get", "list", "watch", "create", "patch", "delete"]
  {{- if not .Values.watchNamespaces }}
  # The reclaim policy of the volume a claim is bound to (Retain: reported, not deleted).
  - apiGroups: [""]
    resources: ["persistentvolumes"]
    verbs: ["get"]
  # The architecture of the node a backup Job would run on (kubernetes.io/arch).
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get"]
  {{- end }}
  # A policy's store credentials (spec.objectStore.credentialsSecret): read, never listed.
  - apiGroups: [""]
    resources: ["secrets"]
    verbs: ["get"]
  # BackupAdoptionRefused, BackupRetention and the other events.
  - apiGroups: ["events.k8s.io"]
    resources: ["events"]
    verbs: ["create", "patch"]
{{- end }}
