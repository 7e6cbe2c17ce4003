//! What the cluster's administrator lets a tenant's objects ask of the shared operator
//! (issue 28): a tenant may create BackupPolicies and Backups, not decide how long a
//! bucket's objects cannot be deleted by anyone, nor run pods with more than they may.

use k8s_openapi::api::core::v1::PodSpec;
use tidemark_api::crd::BackupPolicy;
use tidemark_core::RetentionDuration;
use tidemark_core::lock::{LockMode, ObjectLock};

use crate::error::Error;

/// The administrator's bounds (`tidemark operator` flags).
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// The longest lock the operator sets, from the moment it sets it
    /// (`--max-lock-period`); `None`: no bound. A policy whose period is longer is refused,
    /// and a chain's date (a full locked until its last increment's slot plus the period)
    /// is cut to it.
    pub max_lock_period: Option<RetentionDuration>,
    /// Whether policies may lock in compliance mode, which nobody — not the bucket's
    /// owner — can lift before the date (`--allow-compliance-locks`). Off: governance only.
    pub allow_compliance: bool,
    /// Whether `method: job` templates and DeleteHook Jobs may ask for privileged
    /// containers, host paths, host namespaces or another service account
    /// (`--allow-privileged-templates`). Off: such a template is refused.
    pub allow_privileged_templates: bool,
    /// Whether `spec.binlogArchive.server.image` may name an image other than the
    /// database container's (`--allow-archiver-images`). Off: refused — the archiver holds
    /// the store's keys and the database login, so the image a tenant names would run with
    /// them (issue 42 §5).
    pub allow_archiver_images: bool,
    /// Whether a BackupPolicy may name Secrets not labelled
    /// `tidemark.io/policy-secret: "true"` (`--allow-unlabelled-secrets`). Off: refused
    /// (issue 42 §5).
    pub allow_unlabelled_secrets: bool,
    /// The operator's own namespace when it serves every namespace: never served (its
    /// service account reads every Secret there, and its own objects live there).
    pub own_namespace: Option<String>,
    /// Address ranges a store endpoint may not resolve to (`--deny-endpoints`): by default
    /// the link-local ranges, where clouds serve instance metadata and credentials.
    pub denied_endpoints: Vec<Cidr>,
}

/// The ranges denied by default: link-local, IPv4 and IPv6 (`169.254.169.254` is the
/// instance-metadata service of AWS, GCP and Azure), AWS's IPv6 metadata address
/// (`fd00:ec2::254`), and loopback (the operator's own pod: its metrics and health) with
/// the unspecified addresses, which reach it too (`0.0.0.0`, `::`).
pub const DEFAULT_DENIED_ENDPOINTS: &str =
    "169.254.0.0/16,fe80::/10,fd00:ec2::254/128,127.0.0.0/8,::1/128,0.0.0.0/8,::/128";

/// How long resolving a store endpoint's name may take.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub use tidemark_store::deny::{Cidr, parse_cidrs};

/// The sysctls Pod Security's "baseline" allows (namespaced to the pod).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

impl Tenancy {
    /// Whether a policy's store `endpoint` may be reached: none of the addresses its host
    /// resolves to is in [`Tenancy::denied_endpoints`]. A tenant's endpoint is otherwise
    /// a way to make the operator send signed requests from its own network position, to
    /// the cloud's metadata service say. This refuses the policy at once, naming the
    /// range; every connection of the store's client is checked again
    /// (`tidemark_store::deny`), so a redirect or a name that changes its answer later
    /// reaches no denied address either.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming the endpoint, the address and the range.
    pub async fn check_endpoint(&self, endpoint: &str) -> Result<(), Error> {
        if self.denied_endpoints.is_empty() {
            return Ok(());
        }
        let Ok(uri) = endpoint.parse::<http::Uri>() else {
            // Not a URL: the store's own check refuses it with the form.
            return Ok(());
        };
        let Some(host) = uri.host() else {
            return Ok(());
        };
        let refused =
            |e: String| Error::Invalid(format!("spec.objectStore.endpoint {endpoint:?}: {e}"));
        tidemark_store::deny::check_literal(&self.denied_endpoints, host).map_err(refused)?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<std::net::IpAddr>().is_ok() {
            return Ok(());
        }
        match tokio::time::timeout(
            RESOLVE_TIMEOUT,
            tidemark_store::deny::resolve(&self.denied_endpoints, bare),
        )
        .await
        {
            Ok(Err(e)) if e.contains("--deny-endpoints") => Err(refused(e)),
            // Unresolvable now: the request fails as unreachable, with its reason.
            _ => Ok(()),
        }
    }

    /// `policy`'s object lock, if this operator allows it.
    ///
    /// # Errors
    /// [`Error::Invalid`]: the lock is malformed, in compliance mode without
    /// `--allow-compliance-locks`, or longer than `--max-lock-period` — each named.
    pub fn object_lock(&self, policy: &BackupPolicy) -> Result<Option<ObjectLock>, Error> {
        let Some(lock) = policy
            .spec
            .object_lock()
            .map_err(|e| Error::Invalid(e.to_string()))?
        else {
            return Ok(None);
        };
        if lock.mode == LockMode::Compliance && !self.allow_compliance {
            return Err(Error::Invalid(
                "spec.objectStore.objectLock.mode: compliance locks cannot be lifted by anyone \
                 before their date, and this operator's administrator has not allowed them \
                 (tidemark operator --allow-compliance-locks); use governance"
                    .into(),
            ));
        }
        if let Some(max) = self.max_lock_period
            && lock.period.as_signed_duration() > max.as_signed_duration()
        {
            return Err(Error::Invalid(format!(
                "object lock period {}: longer than this operator allows ({max}, its \
                 administrator's --max-lock-period); give spec.objectStore.objectLock.period \
                 of at most {max}",
                lock.period
            )));
        }
        Ok(Some(lock))
    }

    /// Whether a tenant's pod template (`field`, for the message) asks for more than the
    /// tenant may be given through the operator: a privileged container, added
    /// capabilities, a host path, a host namespace or port, or a service account other
    /// than the namespace's default. The operator creates the Job with its own rights, so
    /// a user allowed only to create Backups would otherwise get pods their own RBAC and
    /// the namespace's admission refuse them.
    ///
    /// # Errors
    /// The first such request, named with its path, and the flag that allows it.
    pub fn check_pod(&self, spec: &PodSpec, field: &str) -> Result<(), String> {
        if self.allow_privileged_templates {
            return Ok(());
        }
        let refused = |what: String| {
            Err(format!(
                "{field}: {what}; pods from a tenant's template get no more than the \
                 namespace's default (the cluster's administrator may allow it: tidemark \
                 operator --allow-privileged-templates)"
            ))
        };
        for (name, set) in [
            ("hostNetwork", spec.host_network),
            ("hostPID", spec.host_pid),
            ("hostIPC", spec.host_ipc),
        ] {
            if set == Some(true) {
                return refused(format!("spec.{name} is set"));
            }
        }
        for account in [&spec.service_account_name, &spec.service_account]
            .into_iter()
            .flatten()
        {
            if account != "default" {
                return refused(format!("spec.serviceAccountName is {account:?}"));
            }
        }
        for v in spec.volumes.iter().flatten() {
            if v.host_path.is_some() {
                return refused(format!("volume {:?} is a hostPath", v.name));
            }
        }
        // The rest of Pod Security's "baseline": no unconfined profiles, no sysctls
        // beyond the namespaced safe set, no Windows host process.
        if let Some(psc) = &spec.security_context {
            if psc
                .seccomp_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                return refused("spec.securityContext.seccompProfile is Unconfined".into());
            }
            if psc
                .app_armor_profile
                .as_ref()
                .is_some_and(|p| p.type_ == "Unconfined")
            {
                return refused("spec.securityContext.appArmorProfile is Unconfined".into());
            }
            if let Some(s) = psc
                .sysctls
                .iter()
                .flatten()
                .find(|s| !SAFE_SYSCTLS.contains(&s.name.as_str()))
            {
                return refused(format!("spec.securityContext.sysctls sets {:?}", s.name));
            }
            if psc.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
                return refused("spec.securityContext.windowsOptions.hostProcess is set".into());
            }
        }
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .map(|c| {
                (
                    c.name.as_str(),
                    c.security_context.as_ref(),
                    c.ports.as_ref(),
                )
            });
        let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| {
            (
                c.name.as_str(),
                c.security_context.as_ref(),
                c.ports.as_ref(),
            )
        });
        for (name, security, ports) in containers.chain(ephemeral) {
            if let Some(sc) = security {
                if sc.privileged == Some(true) {
                    return refused(format!("container {name:?} is privileged"));
                }
                if sc
                    .capabilities
                    .as_ref()
                    .and_then(|c| c.add.as_ref())
                    .is_some_and(|a| !a.is_empty())
                {
                    return refused(format!("container {name:?} adds capabilities"));
                }
                if sc
                    .seccomp_profile
                    .as_ref()
                    .is_some_and(|p| p.type_ == "Unconfined")
                    || sc
                        .app_armor_profile
                        .as_ref()
                        .is_some_and(|p| p.type_ == "Unconfined")
                {
                    return refused(format!("container {name:?} runs unconfined"));
                }
                if sc.proc_mount.as_deref().is_some_and(|m| m != "Default") {
                    return refused(format!("container {name:?} unmasks /proc"));
                }
                if sc.windows_options.as_ref().and_then(|w| w.host_process) == Some(true) {
                    return refused(format!("container {name:?} is a Windows host process"));
                }
            }
            if ports
                .iter()
                .flat_map(|p| p.iter())
                .any(|p| p.host_port.is_some())
            {
                return refused(format!("container {name:?} takes a hostPort"));
            }
        }
        Ok(())
    }

    /// [`Tenancy::check_pod`] on the security settings a pod of Tidemark's copies from a
    /// database pod (the archiver, consolidation, restore-test and Restore Jobs run with
    /// them): what the database pod may have is not what a tenant may have the operator
    /// give its own pods (issue 42 §5).
    ///
    /// # Errors
    /// As [`Tenancy::check_pod`], naming the database pod's setting.
    pub fn check_copied(
        &self,
        pod: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
        container: Option<&k8s_openapi::api::core::v1::SecurityContext>,
        from: &str,
    ) -> Result<(), String> {
        let spec = PodSpec {
            security_context: pod.cloned(),
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "database".into(),
                security_context: container.cloned(),
                ..Default::default()
            }],
            ..Default::default()
        };
        self.check_pod(&spec, from)
    }

    /// Whether objects of `namespace` are served.
    pub fn serves(&self, namespace: Option<&str>) -> bool {
        self.own_namespace.is_none() || self.own_namespace.as_deref() != namespace
    }

    /// `until` cut to `--max-lock-period` from `now`.
    #[must_use]
    pub fn bound_lock_date(&self, until: jiff::Timestamp, now: jiff::Timestamp) -> jiff::Timestamp {
        match self.max_lock_period {
            Some(max) => until.min(max.after(now)),
            None => until,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    /// Issue 42 §5: what Tidemark's pods copy from a database pod passes the template
    /// check: a privileged or capability-adding database container is refused, naming
    /// where it comes from, unless the administrator allows it.
    #[test]
    fn copied_security_settings_are_checked() {
        use k8s_openapi::api::core::v1::{Capabilities, SecurityContext};
        let strict = Tenancy::default();
        let privileged = SecurityContext {
            privileged: Some(true),
            ..Default::default()
        };
        let adds = SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["SYS_ADMIN".into()]),
                drop: None,
            }),
            ..Default::default()
        };
        for sc in [&privileged, &adds] {
            let e = strict
                .check_copied(None, Some(sc), "the security settings of pod db-0")
                .unwrap_err();
            assert!(e.starts_with("the security settings of pod db-0"), "{e}");
            assert!(e.contains("--allow-privileged-templates"), "{e}");
        }
        assert!(strict.check_copied(None, None, "x").is_ok());
        let allowing = Tenancy {
            allow_privileged_templates: true,
            ..Default::default()
        };
        assert!(allowing.check_copied(None, Some(&privileged), "x").is_ok());
    }

    use serde_json::json;

    fn policy(mode: &str, period: &str) -> BackupPolicy {
        serde_json::from_value(json!({
            "apiVersion": "tidemark.io/v1alpha1", "kind": "BackupPolicy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"objectStore": {"bucket": "b",
                "objectLock": {"mode": mode, "period": period}}},
        }))
        .unwrap()
    }

    #[test]
    fn the_administrator_bounds_locks() {
        let open = Tenancy::default();
        // Governance, any period, without a bound.
        assert!(
            open.object_lock(&policy("governance", "3650d"))
                .unwrap()
                .is_some()
        );
        // Compliance only when allowed.
        let e = open.object_lock(&policy("compliance", "7d")).unwrap_err();
        assert!(e.to_string().contains("--allow-compliance-locks"), "{e}");
        let admin = Tenancy {
            max_lock_period: Some("90d".parse().unwrap()),
            allow_compliance: true,
            ..Tenancy::default()
        };
        assert!(
            admin
                .object_lock(&policy("compliance", "7d"))
                .unwrap()
                .is_some()
        );
        let e = admin.object_lock(&policy("governance", "91d")).unwrap_err();
        assert!(e.to_string().contains("90d"), "{e}");
        // A chain's date is cut to the bound.
        let now: jiff::Timestamp = "2026-11-27T00:00:00Z".parse().unwrap();
        let far: jiff::Timestamp = "2226-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(
            admin.bound_lock_date(far, now),
            "2027-02-25T00:00:00Z".parse::<jiff::Timestamp>().unwrap()
        );
        assert_eq!(open.bound_lock_date(far, now), far);
    }

    #[test]
    fn a_template_gets_no_more_than_the_namespace_default() {
        let strict = Tenancy::default();
        let pod = |v: serde_json::Value| -> PodSpec { serde_json::from_value(v).unwrap() };
        let plain = pod(json!({"containers": [{"name": "b", "image": "x",
            "securityContext": {"runAsUser": 1000, "capabilities": {"drop": ["ALL"]}}}],
            "serviceAccountName": "default",
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}));
        assert_eq!(strict.check_pod(&plain, "spec.jobTemplate.spec"), Ok(()));
        let safe = pod(json!({"containers": [{"name": "b",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}, "procMount": "Default"}}],
            "securityContext": {"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}}));
        assert_eq!(strict.check_pod(&safe, "f"), Ok(()));
        for (bad, named) in [
            (
                json!({"containers": [{"name": "b", "securityContext": {"privileged": true}}]}),
                "privileged",
            ),
            (
                json!({"containers": [{"name": "b"}], "initContainers": [{"name": "i",
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}),
                "adds capabilities",
            ),
            (
                json!({"containers": [{"name": "b"}], "hostPID": true}),
                "hostPID",
            ),
            (
                json!({"containers": [{"name": "b"}], "hostNetwork": true}),
                "hostNetwork",
            ),
            (
                json!({"containers": [{"name": "b"}], "hostIPC": true}),
                "hostIPC",
            ),
            (
                json!({"containers": [{"name": "b"}], "serviceAccountName": "tidemark-operator"}),
                "tidemark-operator",
            ),
            (
                json!({"containers": [{"name": "b"}], "serviceAccount": "admin"}),
                "admin",
            ),
            (
                json!({"containers": [{"name": "b"}], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
                "hostPath",
            ),
            (
                json!({"containers": [{"name": "b", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
                "hostPort",
            ),
            (
                json!({"containers": [{"name": "b"}], "securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
                "seccompProfile",
            ),
            (
                json!({"containers": [{"name": "b", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}]}),
                "unconfined",
            ),
            (
                json!({"containers": [{"name": "b", "securityContext": {"procMount": "Unmasked"}}]}),
                "/proc",
            ),
            (
                json!({"containers": [{"name": "b"}], "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
                "kernel.msgmax",
            ),
            (
                json!({"containers": [{"name": "b", "securityContext": {"windowsOptions": {"hostProcess": true}}}]}),
                "host process",
            ),
        ] {
            let e = strict
                .check_pod(&pod(bad), "spec.jobTemplate.spec")
                .unwrap_err();
            assert!(
                e.contains(named) && e.contains("--allow-privileged-templates"),
                "{e}"
            );
        }
        let allowed = Tenancy {
            allow_privileged_templates: true,
            ..Tenancy::default()
        };
        let privileged =
            pod(json!({"containers": [{"name": "b", "securityContext": {"privileged": true}}]}));
        assert_eq!(allowed.check_pod(&privileged, "f"), Ok(()));
        // The operator's own namespace is never served in a cluster-wide install.
        let wide = Tenancy {
            own_namespace: Some("tidemark-system".into()),
            ..Tenancy::default()
        };
        assert!(!wide.serves(Some("tidemark-system")));
        assert!(wide.serves(Some("team-a")));
        assert!(Tenancy::default().serves(Some("tidemark-system")));
    }
}
