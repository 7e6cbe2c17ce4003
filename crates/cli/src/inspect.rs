//! `describe` and `logs` of a Backup or Restore (issue 46 §4), as the kubectl plugin
//! `kubectl tidemark describe|logs backup|restore NAME`: the object's spec, status,
//! conditions and events in one screen, and its Job's log — the pod's while the Job is
//! there, else the end of it the operator kept in the status (`logTail`) when the Job
//! ended, so a failure can still be read after the Job and its pod are gone.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tidemark_api::crd::{Backup, Restore};

use crate::args::{DescribeArgs, LogsArgs, ObjectKind};
use crate::cluster::{api_error, client_in};
use crate::exit::{CliError, Exit};
use crate::output::{emit, emit_as, printable, table};

/// A Backup or Restore as read: the whole object, its Job and the log end kept.
struct Object {
    kind: &'static str,
    value: Value,
    job: Option<String>,
    log_tail: Option<String>,
}

impl ObjectKind {
    fn name(self) -> &'static str {
        match self {
            ObjectKind::Backup => "backup",
            ObjectKind::Restore => "restore",
        }
    }
}

async fn read(client: &Client, ns: &str, kind: ObjectKind, name: &str) -> Result<Object, CliError> {
    let missing = |k: &str, plural: &str| {
        CliError::input(format!(
            "{k} {ns}/{name} does not exist (kubectl get {plural}.tidemark.io -n {ns})"
        ))
    };
    let internal = |e: serde_json::Error| CliError::new(Exit::Internal, e);
    Ok(match kind {
        ObjectKind::Backup => {
            let b = Api::<Backup>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|e| api_error(&format!("Backup {ns}/{name}"), e))?
                .ok_or_else(|| missing("Backup", "backups"))?;
            let st = b.status.clone().unwrap_or_default();
            Object {
                kind: "Backup",
                value: serde_json::to_value(&b).map_err(internal)?,
                job: st.job_name,
                log_tail: st.log_tail,
            }
        }
        ObjectKind::Restore => {
            let r = Api::<Restore>::namespaced(client.clone(), ns)
                .get_opt(name)
                .await
                .map_err(|e| api_error(&format!("Restore {ns}/{name}"), e))?
                .ok_or_else(|| missing("Restore", "restores"))?;
            let st = r.status.clone().unwrap_or_default();
            Object {
                kind: "Restore",
                value: serde_json::to_value(&r).map_err(internal)?,
                job: st.job,
                log_tail: st.log_tail,
            }
        }
    })
}

#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EventOut {
    #[serde(rename = "type")]
    kind: String,
    reason: String,
    note: String,
    at: Option<Timestamp>,
    count: i32,
}

/// Only this object's, by its uid: another operator's kind of the same name (a `Backup`
/// of CloudNativePG's, say) has events of its own.
async fn events(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    uid: &str,
) -> Result<Vec<EventOut>, CliError> {
    let list: Vec<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns)
        .list(
            &ListParams::default().fields(&format!("regarding.kind={kind},regarding.name={name}")),
        )
        .await
        .map_err(|e| api_error(&format!("Events in {ns}"), e))?
        .items;
    let mut out: Vec<EventOut> = list
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.uid.as_deref() == Some(uid) && r.name.as_deref() == Some(name))
        })
        .map(|e| EventOut {
            at: crate::cluster::last_seen(&e),
            count: crate::cluster::times_seen(&e),
            kind: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            note: e.note.unwrap_or_default(),
        })
        .collect();
    out.sort_by_key(|e| e.at);
    Ok(out)
}

/// `describe backup|restore NAME`.
///
/// # Errors
/// No cluster configuration, no such object, or the API refused a read.
pub async fn describe(args: &DescribeArgs) -> Result<Exit, CliError> {
    let (client, ns) = client_in(&args.object.kube).await?;
    let object = read(&client, &ns, args.object.kind, &args.object.name).await?;
    let uid = object.value["metadata"]["uid"].as_str().unwrap_or_default();
    let events = events(&client, &ns, object.kind, &args.object.name, uid).await?;
    if args.output.structured() {
        emit_as(
            args.output,
            &json!({"object": object.value, "events": events}),
        )?;
    } else {
        emit(&describe_text(args.object.kind, &ns, &object, &events)?)?;
    }
    Ok(Exit::Success)
}

/// `describe`'s screen: as kubectl's own, the object's metadata, spec and status (its
/// conditions as a table, its kept log as a line pointing at `logs`) and its events.
fn describe_text(
    kind: ObjectKind,
    ns: &str,
    object: &Object,
    events: &[EventOut],
) -> Result<String, CliError> {
    let v = &object.value;
    let meta = &v["metadata"];
    let str_of = |v: &Value| v.as_str().map(printable).unwrap_or_else(|| "-".to_owned());
    let labels = meta["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| printable(&format!("{k}={}", v.as_str().unwrap_or_default())))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "-".to_owned());
    let mut out = format!(
        "Name:       {}\nNamespace:  {ns}\nKind:       {} ({})\nCreated:    {}\nLabels:     {labels}\n",
        str_of(&meta["name"]),
        object.kind,
        tidemark_api::API_VERSION,
        str_of(&meta["creationTimestamp"]),
    );
    let indented = |value: &Value| -> Result<String, CliError> {
        let text = crate::output::rendered_as(crate::args::OutputFormat::Yaml, value)?;
        Ok(text
            .lines()
            .map(|l| format!("  {}\n", printable(l)))
            .collect())
    };
    out.push_str("Spec:\n");
    out.push_str(&indented(&v["spec"])?);
    let mut status = v["status"].clone();
    let conditions = status
        .as_object_mut()
        .and_then(|s| s.remove("conditions"))
        .and_then(|c| c.as_array().cloned())
        .unwrap_or_default();
    if let Some(s) = status.as_object_mut() {
        s.remove("logTail");
    }
    out.push_str("Status:\n");
    if status.as_object().is_some_and(|s| !s.is_empty()) {
        out.push_str(&indented(&status)?);
    } else {
        out.push_str("  (none yet: the operator has not acted on it)\n");
    }
    if !conditions.is_empty() {
        let rows: Vec<Vec<String>> = conditions
            .iter()
            .map(|c| {
                vec![
                    str_of(&c["type"]),
                    str_of(&c["status"]),
                    str_of(&c["reason"]),
                    str_of(&c["lastTransitionTime"]),
                    str_of(&c["message"]),
                ]
            })
            .collect();
        out.push_str("Conditions:\n");
        for line in table(&["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"], &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    let name = str_of(&meta["name"]);
    let log = match (&object.job, &object.log_tail) {
        (_, Some(t)) => format!(
            "{} line(s) of the Job's log kept: kubectl tidemark logs {} {name} -n {ns}",
            t.lines().count(),
            kind.name()
        ),
        (Some(job), None) => format!(
            "Job {job} (no end of its log kept yet): kubectl tidemark logs {} {name} -n {ns}",
            kind.name()
        ),
        (None, None) => "no Job (yet)".to_owned(),
    };
    out.push_str(&format!("Log:        {log}\n"));
    out.push_str("Events:\n");
    if events.is_empty() {
        out.push_str("  <none>\n");
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    printable(&e.kind),
                    printable(&e.reason),
                    e.at.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                    e.count.to_string(),
                    printable(&e.note),
                ]
            })
            .collect();
        for line in table(&["TYPE", "REASON", "AT", "COUNT", "NOTE"], &rows).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    Ok(out)
}

/// `logs backup|restore NAME`: the newest pod of the object's Job while there is one
/// (its main container, the last `--tail` lines), else the end of the log kept in the
/// status, said on stderr which it is.
///
/// # Errors
/// No cluster configuration, no such object, or no log at all (no Job yet, or a method
/// without one and nothing kept).
pub async fn logs(args: &LogsArgs) -> Result<Exit, CliError> {
    let (client, ns) = client_in(&args.object.kube).await?;
    let object = read(&client, &ns, args.object.kind, &args.object.name).await?;
    let what = format!("{} {ns}/{}", object.kind, args.object.name);
    let mut unread = None;
    if let Some(job) = &object.job {
        match job_log(&client, &ns, job, args.tail).await? {
            PodLog::Text(text) => {
                emit(&text)?;
                return Ok(Exit::Success);
            }
            PodLog::Unread(why) => unread = Some(why),
            PodLog::NoPod => {}
        }
    }
    if let (Some(why), None) = (&unread, &object.log_tail) {
        return Err(CliError::input(format!(
            "{what}: {why}: try again in a moment, or kubectl tidemark describe {} {} -n {ns}",
            args.object.kind.name(),
            args.object.name
        )));
    }
    match (&object.log_tail, &object.job) {
        (Some(kept), job) => {
            eprintln!(
                "{what}: {} is gone; the end of its log, kept in the status when it ended:",
                job.as_deref()
                    .map_or_else(|| "its Job".to_owned(), |j| format!("Job {j}"))
            );
            let mut text: String = kept
                .lines()
                .map(|l| format!("{}\n", printable(l)))
                .collect();
            if text.is_empty() {
                text.push('\n');
            }
            emit(&text)?;
            Ok(Exit::Success)
        }
        (None, Some(job)) => Err(CliError::input(format!(
            "{what}: Job {job} has no pod left and no end of its log was kept (the operator keeps it when it sees the Job end; a Backup by method exec has no Job: its status.error holds the command's last words)"
        ))),
        (None, None) => Err(CliError::input(format!(
            "{what} has no Job (yet): kubectl tidemark describe {} {} -n {ns} says why",
            args.object.kind.name(),
            args.object.name
        ))),
    }
}

/// What a Job's newest pod says.
enum PodLog {
    Text(String),
    /// No pod left.
    NoPod,
    /// A pod whose log cannot be read (yet): why.
    Unread(String),
}

/// The log of the newest pod of Job `job` (its first container: the backup's or restore's
/// own, after the init container that installs the binary).
async fn job_log(client: &Client, ns: &str, job: &str, tail: i64) -> Result<PodLog, CliError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map_err(|e| api_error(&format!("the pods of Job {ns}/{job}"), e))?;
    let Some(pod) = list
        .items
        .into_iter()
        .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
    else {
        return Ok(PodLog::NoPod);
    };
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone());
    let params = LogParams {
        container,
        tail_lines: Some(tail),
        ..Default::default()
    };
    match pods.logs(&pod.name_any(), &params).await {
        Ok(text) => Ok(PodLog::Text(
            text.lines()
                .map(|l| format!("{}\n", printable(l)))
                .collect(),
        )),
        // Not started yet (pending, its image being pulled), or its log gone with the node.
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 404 => {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "Unknown".into());
            Ok(PodLog::Unread(format!(
                "Job {job}'s pod {} has no log to show (phase {phase}): {}",
                pod.name_any(),
                printable(&s.message)
            )))
        }
        Err(e) => Err(api_error(
            &format!("the log of pod {ns}/{}", pod.name_any()),
            e,
        )),
    }
}
