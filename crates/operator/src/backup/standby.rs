//! `prefer-standby` with `spec.source.standbyMaxLag`: a standby is backed up only when it
//! replicates and lags its primary by at most that much; a replica whose replication is
//! stopped or broken is never picked. Without it, standbys that can be asked still are
//! (any lag), and one that cannot be asked is chosen on its readiness, as without probing. Each Ready standby is asked in its database container
//! through `pods/exec` (`mariadb`, `SHOW ALL SLAVES STATUS`), logging in with the policy's
//! `source.credentialsSecret`; when none is fit, the primary is backed up, and the Backup's
//! status says which standbys were skipped and why.
//!
//! # The login
//! The option file (`[client]` user and password) goes to the container's `mariadb` on its
//! standard input, never in an argument. API servers before 1.29 speak an exec protocol
//! that cannot end a process's input, so the file is sent padded to [`LOGIN_BYTES`] and
//! read with `head -c`: not even its length is in the command line.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, AttachParams};
use tidemark_api::policy::{Login, SecretKeyRef};
use tidemark_mariadb::backup::{PROBE_SQL, ServerProbe, parse_probe};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::context::Context;

/// The option file's size on the wire.
pub const LOGIN_BYTES: usize = 4096;
/// How long one standby may take to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Standbys asked for one Backup at most (the first by name): a tenant's many Ready pods
/// that hang cannot hold a reconcile for long.
const MAX_PROBED: usize = 3;
/// The most of its answer that is read.
const ANSWER_BYTES: u64 = 64 * 1024;

/// Whether a standby may be backed up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fit { lag_seconds: u64 },
    Unfit(String),
}

/// Judges a standby by what it said of itself.
pub fn verdict(probe: &ServerProbe, max_lag_seconds: u64) -> Verdict {
    if !probe.replica {
        return Verdict::Unfit("it replicates from no server".into());
    }
    if !probe.replicating {
        return Verdict::Unfit("its replication is stopped or broken".into());
    }
    match probe.lag_seconds {
        None => Verdict::Unfit("its lag is unknown (Seconds_Behind_Master is NULL)".into()),
        Some(l) if l > max_lag_seconds => Verdict::Unfit(format!(
            "it is {l} s behind its primary, more than spec.source.standbyMaxLag ({max_lag_seconds} s)"
        )),
        Some(l) => Verdict::Fit { lag_seconds: l },
    }
}

/// The command the container runs: the option file from stdin, then the probe.
pub fn probe_command() -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "head -c {LOGIN_BYTES} | exec mariadb --defaults-extra-file=/dev/stdin -B -e \"$1\""
        ),
        "sh".into(),
        PROBE_SQL.into(),
    ]
}

/// The option file for `user`/`password`, padded to [`LOGIN_BYTES`] with a comment (values
/// double-quoted, backslashes and quotes escaped, as the client reads them).
///
/// # Errors
/// The login does not fit, or holds a line break.
pub fn login_file(user: &str, password: &str) -> Result<Vec<u8>, String> {
    let q = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    if user.contains(['\n', '\r']) || password.contains(['\n', '\r']) {
        return Err("the database login holds a line break".into());
    }
    let mut text = format!(
        "[client]\nuser=\"{}\"\npassword=\"{}\"\n#",
        q(user),
        q(password)
    );
    if text.len() + 1 > LOGIN_BYTES {
        return Err(format!(
            "the database login is longer than {} bytes",
            LOGIN_BYTES - 64
        ));
    }
    while text.len() + 1 < LOGIN_BYTES {
        text.push(' ');
    }
    text.push('\n');
    Ok(text.into_bytes())
}

/// The database login of the source (`usernameFrom`/`passwordFrom`, or
/// `credentialsSecret`'s `username` and `password`), read from the API server.
async fn login(ctx: &Context, ns: &str, login: &Login) -> Result<Vec<u8>, String> {
    let user_secret = secret_data(ctx, ns, &login.user, login.user_field).await?;
    // One read when both keys are in one Secret (`credentialsSecret`'s default keys).
    let password_secret = if login.password.name == login.user.name {
        user_secret.clone()
    } else {
        secret_data(ctx, ns, &login.password, login.password_field).await?
    };
    let user = login_value(ns, &user_secret, &login.user, login.user_field)?;
    let password = login_value(ns, &password_secret, &login.password, login.password_field)?;
    login_file(&user, &password)
}

/// The data of the Secret `r` names (its name checked before it reaches a request path).
async fn secret_data(
    ctx: &Context,
    ns: &str,
    r: &SecretKeyRef,
    field: &'static str,
) -> Result<std::collections::BTreeMap<String, k8s_openapi::ByteString>, String> {
    r.validate(field, field).map_err(|e| e.to_string())?;
    let name = &r.name;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let found = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("reading Secret {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("Secret {ns}/{name} ({field}) does not exist"))?;
    if !ctx.tenancy.allow_unlabelled_secrets && !crate::stores::secret_opted_in(found.labels()) {
        return Err(crate::stores::secret_not_opted_in(ns, name, field));
    }
    Ok(found.data.unwrap_or_default())
}

/// One value of the login from its Secret's data (never repeated in a message).
fn login_value(
    ns: &str,
    data: &std::collections::BTreeMap<String, k8s_openapi::ByteString>,
    r: &SecretKeyRef,
    field: &'static str,
) -> Result<String, String> {
    data.get(&r.key)
        .and_then(|v| String::from_utf8(v.0.clone()).ok())
        .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
        .ok_or_else(|| format!("Secret {ns}/{} ({field}) lacks key {:?}", r.name, r.key))
}

/// Asks one pod's database container about its replication.
async fn probe(
    ctx: &Context,
    pod: &Pod,
    container: &str,
    login: &[u8],
) -> Result<ServerProbe, String> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
    let params = AttachParams::default()
        .container(container)
        .stdin(true)
        .stdout(true)
        .stderr(true);
    let asked = async {
        let mut p = pods
            .exec(&pod.name_any(), probe_command(), &params)
            .await
            .map_err(|e| format!("pods/exec: {e}"))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) = (p.stdin(), p.stdout(), p.stderr())
        else {
            return Err("pods/exec gave no streams".to_owned());
        };
        stdin
            .write_all(login)
            .await
            .map_err(|e| format!("sending the login: {e}"))?;
        let mut out = String::new();
        let mut err = String::new();
        let (mut stdout, mut stderr) = (stdout.take(ANSWER_BYTES), stderr.take(ANSWER_BYTES));
        let (o, e) = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        o.map_err(|e| format!("reading its answer: {e}"))?;
        let _ = e;
        let status = match p.take_status() {
            Some(s) => s.await,
            None => None,
        };
        drop(stdin);
        if status.as_ref().and_then(|s| s.status.as_deref()) != Some("Success") {
            let said = err.lines().last().unwrap_or_default().to_owned();
            return Err(format!(
                "mariadb failed{}",
                if said.is_empty() {
                    String::new()
                } else {
                    format!(": {said}")
                }
            ));
        }
        Ok(parse_probe(&out))
    };
    match tokio::time::timeout(PROBE_TIMEOUT, asked).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
    }
}

/// The database container of `pod`: the source's `container`, else the first.
fn container_of(source: &tidemark_api::crd::SourceSpec, pod: &Pod) -> String {
    match &source.container {
        Some(c) => c.clone(),
        None => pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone())
            .unwrap_or_default(),
    }
}

/// The `@@server_id` of the database in `pod` (the cluster's labelled primary: only it
/// starts a timeline of the binlog archive, issue 42 §3), asked as the standbys are.
///
/// # Errors
/// The operator may not use `pods/exec`, the source has no login, or the server did not
/// answer with one.
pub(crate) async fn server_id_of(
    ctx: &Context,
    source: &tidemark_api::crd::SourceSpec,
    pod: &Pod,
) -> Result<u32, String> {
    if !ctx.capabilities.exec {
        return Err("the operator may not use pods/exec (--disable exec)".into());
    }
    if source.is_mysql() {
        return Err("a MySQL server is not asked through pods/exec yet".into());
    }
    let secret = source
        .login()
        .ok_or("spec.source has no login (credentialsSecret, or usernameFrom and passwordFrom)")?;
    let login = login(ctx, &pod.namespace().unwrap_or_default(), &secret).await?;
    probe(ctx, pod, &container_of(source, pod), &login)
        .await?
        .server_id
        .ok_or_else(|| "the server answered no server id".to_owned())
}

/// The first fit standby of `standbys` (in order), with what was said of those skipped;
/// `Err`: none is fit (or none could be asked), and why.
pub(crate) async fn first_fit<'a>(
    ctx: &Context,
    source: &tidemark_api::crd::SourceSpec,
    standbys: &[&'a Pod],
    max_lag: jiff::SignedDuration,
    unasked_ok: bool,
) -> Result<(&'a Pod, Vec<String>), Vec<String>> {
    let max = u64::try_from(max_lag.as_secs()).unwrap_or(0);
    if !ctx.capabilities.exec {
        return Err(vec![
            "spec.source.standbyMaxLag: the operator may not use pods/exec to ask the standbys (--disable exec)".into(),
        ]);
    }
    let Some(secret) = source.login() else {
        return Err(vec![
            "spec.source.standbyMaxLag needs spec.source.credentialsSecret (or usernameFrom and passwordFrom) to ask the standbys"
                .into(),
        ]);
    };
    let Some(first) = standbys.first() else {
        return Err(vec!["no Ready standby".into()]);
    };
    let login = match login(ctx, &first.namespace().unwrap_or_default(), &secret).await {
        Ok(l) => l,
        Err(e) if unasked_ok => {
            return Ok((
                first,
                vec![format!(
                    "the standbys could not be asked ({e}): standby {} chosen on its readiness",
                    first.name_any()
                )],
            ));
        }
        Err(e) => return Err(vec![format!("the standbys could not be asked: {e}")]),
    };
    let mut skipped = Vec::new();
    for pod in standbys.iter().take(MAX_PROBED) {
        match probe(ctx, pod, &container_of(source, pod), &login).await {
            Ok(p) => match verdict(&p, max) {
                Verdict::Fit { .. } => return Ok((pod, skipped)),
                Verdict::Unfit(why) => {
                    skipped.push(format!("standby {} skipped: {why}", pod.name_any()));
                }
            },
            Err(e) if unasked_ok => {
                skipped.push(format!(
                    "standby {} could not be asked ({e}): chosen on its readiness",
                    pod.name_any()
                ));
                return Ok((pod, skipped));
            }
            Err(e) => skipped.push(format!(
                "standby {} skipped: it could not be asked ({e})",
                pod.name_any()
            )),
        }
    }
    if standbys.len() > MAX_PROBED {
        skipped.push(format!(
            "{} more standby(s) not asked (at most {MAX_PROBED} are)",
            standbys.len() - MAX_PROBED
        ));
    }
    Err(skipped)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_standby_is_fit_only_while_it_replicates_within_the_bound() {
        let p = |replica, replicating, lag| ServerProbe {
            server_id: Some(2),
            replica,
            lag_seconds: lag,
            replicating,
            galera: false,
        };
        assert_eq!(
            verdict(&p(true, true, Some(3)), 300),
            Verdict::Fit { lag_seconds: 3 }
        );
        for (probe, words) in [
            (p(false, false, None), "replicates from no server"),
            (p(true, false, Some(0)), "stopped or broken"),
            (p(true, true, None), "unknown"),
            (p(true, true, Some(301)), "301 s behind"),
        ] {
            match verdict(&probe, 300) {
                Verdict::Unfit(why) => assert!(why.contains(words), "{why}"),
                v => panic!("{v:?}"),
            }
        }
    }

    #[test]
    fn the_login_is_padded_and_escaped() {
        let f = login_file("backup", "p\"a\\ss#1").unwrap();
        assert_eq!(f.len(), LOGIN_BYTES);
        let text = String::from_utf8(f).unwrap();
        assert!(text.starts_with("[client]\nuser=\"backup\"\npassword=\"p\\\"a\\\\ss#1\"\n#"));
        assert!(text.ends_with('\n'));
        assert!(login_file("a", &"x".repeat(5000)).is_err());
        assert!(login_file("a", "x\ny").is_err());
        assert!(probe_command()[2].contains("head -c 4096"));
        assert!(!probe_command().concat().contains("backup"));
    }
}
